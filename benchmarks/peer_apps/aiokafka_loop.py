"""The aiokafka baseline loop of ``benchmarks/kafka_pipeline.py``, as a process of its own.

Run by ``benchmarks/peers.py`` with the project's interpreter:
``aiokafka_loop.py BOOTSTRAP SOURCE_TOPIC SINK_TOPIC GROUP``; stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import baseline


async def main(bootstrap: str, src: str, sink: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await baseline(bootstrap, src, sink, 0, stop)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
