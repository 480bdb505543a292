"""The Kafka benchmarks on both brokers in one run: ``kafka_pipeline.py``, ``peers.py``,
``latency.py`` and ``idle.py``, each with ``--broker kafka`` (Apache Kafka, first) and then
``--broker tansu``, one after the other on the same machine. Every benchmark measures its own
baseline in its run; this collects each one's last line (its JSON figures) and prints them
side by side.

Run: ``.venv/bin/python benchmarks/brokers.py [--only kafka_pipeline,peers] [--quick]``
(``--quick``: smaller sizes, minutes instead of the better part of an hour).

Last line: one JSON object, ``{benchmark: {broker: figures}}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: benchmark -> (full arguments, --quick arguments)
RUNS: dict[str, tuple[list[str], list[str]]] = {
    "kafka_pipeline": ([], ["--events", "100000", "--latency-seconds", "5"]),
    "peers": ([], ["--events", "50000", "--latency-seconds", "4"]),
    "latency": ([], ["--events", "50000", "--latency-seconds", "4"]),
    "idle": (
        ["--doorbell", "both"],
        [
            "--doorbell",
            "both",
            "--window-s",
            "15",
            "--settle-s",
            "8",
            "--idle-s",
            "8",
            "--rounds",
            "3",
            "--cold-rounds",
            "2",
        ],
    ),
}
BROKERS = ("kafka", "tansu")


def last_json(text: str) -> dict[str, object] | None:
    """The last line of ``text`` that is a JSON object."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(RUNS)}")
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    args = ap.parse_args()
    only = [b for b in args.only.split(",") if b] or list(RUNS)
    unknown = sorted(set(only) - set(RUNS))
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(RUNS)}")
    results: dict[str, dict[str, object]] = {}
    for name in only:
        full, quick = RUNS[name]
        for broker in BROKERS:
            argv = [sys.executable, str(HERE / f"{name}.py"), "--broker", broker]
            argv += quick if args.quick else full
            started = time.monotonic()
            print(f"== {name} on {broker}: {' '.join(argv[1:])}", flush=True)
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            figures = last_json(proc.stdout)
            took = round(time.monotonic() - started, 1)
            if proc.returncode != 0 or figures is None:
                print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", flush=True)
                figures = {"error": f"exit {proc.returncode}", "took_s": took}
            else:
                print(json.dumps(figures), flush=True)
                figures["took_s"] = took
            results.setdefault(name, {})[broker] = figures
    print(json.dumps(results))


if __name__ == "__main__":
    main()
