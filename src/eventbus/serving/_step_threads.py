"""Where a replica's sources run the steps over a batch: on the sources' event loop, on
worker threads, or on one worker thread in order.

* **the loop** (the default): cheap steps, no waiting; a batch runs between the loop's other
  work.
* **worker threads** (a step is ``blocking``: a model step waits on another deployment): the
  batches in flight run concurrently, so the model's dynamic batching can merge them.
* **one worker thread, in order** (a step is ``offload``: an aggregate step waits on its Redis
  script for much of each batch): the batches run one at a time, in the order they were
  fetched, off the loop; while one waits on Redis, the loop fetches and decodes the next and
  delivers and commits the one before. Measured on ``benchmarks/aggregate.py``: the sources'
  loop spent 21% of its time (34% with ``delivery.dedupe``) blocked on the add script's reply
  with nothing else moving. The steps' guarantees stay those of the loop: one batch at a time
  and in fetch order (the watermark and lateness judged as the events came), its state merged
  before its outputs are sent and its offsets committed (the source waits for the dispatch).

With worker threads beside the loop, the replica's GIL switch interval is shortened
(:meth:`StepThreads.tune_switching`): a thread whose blocking call returns (a Redis reply, a
socket ``settimeout``/``recv``) waits for the GIL until the thread holding it gives it up, and a
thread busy in Python (the loop decoding the next batch) gives it up only every switch
interval, CPython's default 5 ms. redis-py releases the GIL several times per command (the
pool's ``can_read`` check, the send, the reply's poll and recv), so an aggregate step's batch
paid up to tens of milliseconds of such waits beside its few milliseconds in Redis.
Measured in process (the step's batches on one thread, decoding on another, real Redis): the
step's wall time per event 25.7–34.9 µs at 5 ms, 15.6–18.9 µs at 1 ms.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["SWITCH_INTERVAL_S", "StepThreads"]

#: The GIL switch interval of a replica whose steps run on worker threads (see the module).
SWITCH_INTERVAL_S = 0.001

T = TypeVar("T")


class StepThreads:
    """Runs step work for a replica's sources where the steps want it (see the module).

    Args:
        steps: the pipeline's steps (their ``blocking`` and ``offload`` flags choose).
        name: the worker thread's name (``offload``).

    Example:
        >>> threads = StepThreads([])
        >>> threads.mode
        'loop'
    """

    def __init__(self, steps: Sequence[Any], name: str = "eventbus-steps") -> None:
        self.mode = "loop"
        if any(getattr(s, "blocking", False) for s in steps):
            self.mode = "threads"
        elif any(getattr(s, "offload", False) for s in steps):
            self.mode = "ordered"
        self._executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
            if self.mode == "ordered"
            else None
        )

    def tune_switching(self) -> None:
        """With worker threads (``ordered``, ``threads``): shorten this process's GIL switch
        interval to :data:`SWITCH_INTERVAL_S` (never lengthen it), so a thread back from
        Redis or another deployment gets the GIL within a millisecond of asking for it. A
        process-wide setting: call it in the replica, which owns its process."""
        if self.mode != "loop" and sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``: here (the loop), on a worker thread, or queued behind the calls
        made before it on the one ordered thread.

        Raises:
            Exception: what ``fn`` raised.
        """
        if self.mode == "threads":
            return await asyncio.to_thread(fn, *args)
        if self._executor is not None:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        return fn(*args)

    def close(self) -> None:
        """Let the ordered thread finish what it runs, and end it (idempotent)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
