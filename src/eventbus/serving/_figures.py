"""Publishing observability entries to ``eventbus:stats:<pipeline>`` (see
:mod:`eventbus.observability._view` for the entry shapes and how they are merged).

Replicas that run their sources publish from the sources' loop (``_replica_sources``); the
source actors and the gateway from their own loops with :func:`write_entry`; replicas without
sources (``source_placement: actor``) from a daemon thread (:class:`ThreadPublisher`). Each
writes when its figures changed (looking once a second) or at the :data:`HEARTBEAT_S`
heartbeat, never per batch or event, and a last time with ``final`` when it stops, so that
totals do not drop when it goes away. Each write also adds what is new to the pipeline's
15-minute history (:mod:`eventbus.observability._history`) in the same round trip.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from eventbus._internal import keys
from eventbus.observability._history import HistoryRecorder

__all__ = [
    "HEARTBEAT_S",
    "PUBLISH_EVERY_S",
    "ChangeGate",
    "ThreadPublisher",
    "entry_id",
    "write_entry",
]

log = logging.getLogger("eventbus.serving.figures")

PUBLISH_EVERY_S = 1.0
#: Unchanged figures are written again after this long, so that readers, which drop entries
#: not refreshed for ``observability._view.STALE_S`` (15 s) as a dead process's, keep them.
HEARTBEAT_S = 5.0


class ChangeGate:
    """Says when figures are due: when they changed since the last write of their key, or
    :data:`HEARTBEAT_S` after it.

    Args:
        heartbeat_s: the longest time between two writes of one key.

    Example:
        >>> gate = ChangeGate()
        >>> gate.due("p", (1, 2), now=0.0), gate.due("p", (1, 2), now=1.0)
        (True, False)
    """

    def __init__(self, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.heartbeat_s = heartbeat_s
        self._last: dict[str, tuple[Any, float]] = {}

    def due(self, key: str, signature: Any, now: float | None = None) -> bool:
        """Whether ``key``'s figures (summed up by ``signature``, compared with ``==``) should
        be written now; if so, they count as written."""
        now = time.monotonic() if now is None else now
        last = self._last.get(key)
        if last is not None and last[0] == signature and now - last[1] < self.heartbeat_s:
            return False
        self._last[key] = (signature, now)
        return True

    def forget(self, key: str) -> None:
        """Forget ``key`` (its next figures are due at once)."""
        self._last.pop(key, None)


def entry_id(role: str) -> str:
    """A field name unique to this process and publisher: ``<role>-<pid>-<random>``."""
    return f"{role}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def write_entry(
    redis: Any,
    pipeline: str,
    field: str,
    body: dict[str, Any],
    final: bool = False,
    history: HistoryRecorder | None = None,
) -> None:
    """Write one entry (``redis.asyncio`` client): ``body`` plus ``at`` and ``final``; with a
    ``history`` recorder, what is new since its last write goes to the pipeline's history in
    the same round trip."""
    now = time.time()
    value = json.dumps({**body, "at": now, "final": final})
    if history is None:
        await redis.hset(keys.stats(pipeline), field, value)
        return
    pipe = redis.pipeline(transaction=False)
    pipe.hset(keys.stats(pipeline), field, value)
    history.queue(pipe, body, now)
    await pipe.execute()


class ThreadPublisher:
    """Writes ``snapshot()`` under ``field`` every :data:`PUBLISH_EVERY_S` from a daemon thread.

    Args:
        redis_url: the Redis to write to.
        pipeline: whose hash.
        field: the entry's field (:func:`entry_id`).
        snapshot: the entry's body (called on the thread; must be safe to call concurrently
            with the process's work: the runner's counters are).
    """

    def __init__(
        self, redis_url: str, pipeline: str, field: str, snapshot: Callable[[], dict[str, Any]]
    ) -> None:
        from eventbus._internal.redis_client import connect

        self._redis = connect(redis_url)
        self._key = keys.stats(pipeline)
        self.field = field
        self._snapshot = snapshot
        self._gate = ChangeGate()
        self._history = HistoryRecorder(pipeline, field)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="eventbus-figures", daemon=True)

    def start(self) -> None:
        """Start publishing."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop, then write the final entry."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        try:
            self._write(final=True)
        except Exception:
            log.debug("writing the final figures failed", exc_info=True)
        self._redis.close()

    def _write(self, final: bool = False) -> None:
        body = self._snapshot()
        if not final and not self._gate.due(self.field, json.dumps(body, sort_keys=True)):
            return
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(self._key, self.field, json.dumps({**body, "at": now, "final": final}))
        self._history.queue(pipe, body, now)
        pipe.execute()

    def _loop(self) -> None:
        while not self._stop.wait(PUBLISH_EVERY_S):
            try:
                self._write()
            except Exception:
                log.debug("publishing figures failed", exc_info=True)
