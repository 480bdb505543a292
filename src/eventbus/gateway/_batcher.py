"""Micro-batching of concurrent requests into one downstream call.

Callers ``submit`` their items and await their results; the batcher hands whatever has
gathered to one ``flush`` call. With ``linger_ms`` 0 a batch goes out on the next turn of the
event loop, so a lone request waits for nothing; under load, requests gather while up to
``max_in_flight`` flushes are running, so batches grow with the load by themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

__all__ = ["MicroBatcher"]

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """Gather concurrent submissions into batched ``flush`` calls.

    Args:
        flush: called with a flat list of items; returns one result per item, in order.
        max_size: most items per flush (a single larger submission is flushed alone).
        linger_ms: how long to wait after the first item for more.
        max_in_flight: most concurrent flushes.

    Example:
        >>> async def double(xs): return [2 * x for x in xs]
        >>> async def main():
        ...     b = MicroBatcher(double, max_size=100)
        ...     return await asyncio.gather(b.submit([1]), b.submit([2, 3]))
        >>> asyncio.run(main())
        [[2], [4, 6]]
    """

    def __init__(
        self,
        flush: Callable[[list[T]], Awaitable[list[R]]],
        *,
        max_size: int = 1000,
        linger_ms: float = 0.0,
        max_in_flight: int = 4,
    ) -> None:
        self._flush = flush
        self._max_size = max_size
        self._linger_s = linger_ms / 1000.0
        self._slots = asyncio.Semaphore(max_in_flight)
        self._pending: deque[tuple[list[T], asyncio.Future[list[R]]]] = deque()
        self._count = 0
        self._runner: asyncio.Task[None] | None = None
        self._full = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.flushes = 0
        self.items = 0

    async def submit(self, items: list[T]) -> list[R]:
        """Submit items; returns their results once their batch was flushed.

        Raises:
            Exception: whatever the flush raised, for every submission of that batch.
        """
        fut: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        self._pending.append((items, fut))
        self._count += len(items)
        if self._count >= self._max_size:
            self._full.set()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        return await fut

    async def _run(self) -> None:
        while self._pending:
            if self._linger_s > 0 and self._count < self._max_size:
                # Once per batch, and only with a linger (it waits milliseconds anyway).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self._linger_s)
            else:
                await asyncio.sleep(0)  # let the requests of this loop turn join
            await self._slots.acquire()
            batch: list[tuple[list[T], asyncio.Future[list[R]]]] = []
            n = 0
            while self._pending and (not batch or n + len(self._pending[0][0]) <= self._max_size):
                items, fut = self._pending.popleft()
                batch.append((items, fut))
                n += len(items)
            self._count -= n
            if self._count < self._max_size:
                self._full.clear()
            task = asyncio.create_task(self._flush_one(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush_one(self, batch: list[tuple[list[T], asyncio.Future[list[R]]]]) -> None:
        try:
            flat: list[T] = [x for items, _ in batch for x in items]
            try:
                results = await self._flush(flat)
                if len(results) != len(flat):
                    msg = f"flush returned {len(results)} results for {len(flat)} items"
                    raise RuntimeError(msg)
            except BaseException as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            self.flushes += 1
            self.items += len(flat)
            i = 0
            for items, fut in batch:
                if not fut.done():
                    fut.set_result(results[i : i + len(items)])
                i += len(items)
        finally:
            self._slots.release()

    async def close(self) -> None:
        """Wait for the flushes in flight."""
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def stats(self) -> dict[str, Any]:
        """Flushes and items so far (mean batch size = items / flushes)."""
        return {"flushes": self.flushes, "items": self.items, "pending": self._count}
