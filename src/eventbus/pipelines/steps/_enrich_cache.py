"""The ``enrich`` step's answer cache (TTL, LRU, size bounded, single-flight) and its rate
limit (a token bucket). Both live on the step's one event loop (:class:`StepLoop`, a thread
of its own), so they need no locks."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["AnswerCache", "StepLoop", "TokenBucket"]

T = TypeVar("T")

_MISSING = object()


class AnswerCache:
    """Answers by key for ``ttl_s`` (least recently used evicted past ``max_entries``); a key
    being fetched has one future that every concurrent miss of it awaits (single-flight).

    Example:
        >>> c = AnswerCache(ttl_s=60, max_entries=2)
        >>> c.put("a", 1); c.get("a")
        1
    """

    def __init__(
        self, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[Any, tuple[float, Any]] = OrderedDict()
        self._flights: dict[Any, asyncio.Future[Any]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Any, default: Any = _MISSING) -> Any:
        """The fresh answer of ``key``, else ``default`` (raises KeyError when not given)."""
        entry = self._entries.get(key)
        if entry is not None:
            if entry[0] > self._clock():
                self._entries.move_to_end(key)
                return entry[1]
            del self._entries[key]
        if default is _MISSING:
            raise KeyError(key)
        return default

    def put(self, key: Any, value: Any) -> None:
        """Keep ``value`` for ``ttl_s``."""
        self._entries[key] = (self._clock() + self.ttl_s, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def flight(self, key: Any) -> asyncio.Future[Any] | None:
        """The future of a fetch of ``key`` in progress, or None."""
        return self._flights.get(key)

    def start(self, key: Any) -> asyncio.Future[Any]:
        """Mark ``key`` as being fetched; :meth:`finish` settles it."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._flights[key] = fut
        return fut

    def finish(self, key: Any, value: Any = None, error: BaseException | None = None) -> None:
        """Settle ``key``'s fetch: its waiters get ``value`` (cached) or ``error`` (not)."""
        fut = self._flights.pop(key, None)
        if error is None:
            self.put(key, value)
        if fut is None or fut.done():
            return
        if error is None:
            fut.set_result(value)
        else:
            fut.set_exception(error)
            fut.exception()  # retrieved: nobody may be waiting, no "never retrieved" log


class TokenBucket:
    """At most ``burst`` calls at once and ``rate`` per second after: each call reserves a
    token, waiting until it is due (the reservations queue in order)."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def reserve(self) -> float:
        """Take a token; return the seconds to wait before using it (0: now)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def acquire(self) -> bool:
        """Wait for a token; True when it had to wait."""
        wait = self.reserve()
        if wait > 0:
            await asyncio.sleep(wait)
            return True
        return False


class StepLoop:
    """An event loop on a daemon thread of its own (the step's I/O)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()
