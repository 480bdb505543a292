"""Is a replica's sources thread alive and its loop turning? (Serve's ``check_health``.)

The replica placement runs a pipeline's Kafka sources on a thread of the replica with its own
event loop. If that thread dies (a source gave up: ``SourceStalledError``, or a bug) or its
loop stops turning (a step blocking it), the replica still answers Serve's calls, so Serve
would keep it forever while its partitions stall. :meth:`SourcesHealth.check` raises instead,
and Serve replaces the replica; the partitions' uncommitted events are consumed again by the
replica that takes them (at-least-once).
"""

from __future__ import annotations

import asyncio
import threading
import time

__all__ = ["STUCK_AFTER_S", "SourcesHealth"]

#: A sources loop that has not turned for this long is stuck (Serve's health-check timeout is
#: 30 s by default; a pure batch of 2,000 events runs on the loop in well under a second).
STUCK_AFTER_S = 30.0
#: How often the sources loop marks that it turns (a timer per pipeline: well under
#: ``STUCK_AFTER_S``, not every second).
BEAT_EVERY_S = 5.0


class SourcesHealth:
    """The liveness of one replica's sources thread and loop.

    Args:
        pipeline: the pipeline, for messages.
        stuck_after_s: a loop that has not beaten for this long is stuck.
    """

    def __init__(self, pipeline: str, stuck_after_s: float = STUCK_AFTER_S) -> None:
        self.pipeline = pipeline
        self.stuck_after_s = stuck_after_s
        self.stopping = False  # set when the replica stops its sources on purpose
        self._beat: float | None = None

    def beat(self) -> None:
        """Mark that the sources loop turned (called on that loop)."""
        self._beat = time.monotonic()

    async def beat_forever(self) -> None:
        """Beat every :data:`BEAT_EVERY_S` until cancelled (a task on the sources loop)."""
        while True:
            self.beat()
            await asyncio.sleep(BEAT_EVERY_S)

    def check(self, thread: threading.Thread | None, error: BaseException | None) -> None:
        """Raise when the sources cannot be making progress.

        Args:
            thread: the sources thread (None: the replica runs no sources).
            error: what stopped a source or the thread, if anything did.

        Raises:
            RuntimeError: the thread died or the loop has not turned for ``stuck_after_s``.
        """
        if thread is None or self.stopping:
            return
        if not thread.is_alive():
            why = f"{type(error).__name__}: {error}" if error is not None else "no error recorded"
            msg = (
                f"the Kafka sources of pipeline {self.pipeline!r} stopped on this replica "
                f"({why}); reporting unhealthy so that Serve replaces the replica (its "
                "uncommitted events are consumed again)"
            )
            raise RuntimeError(msg)
        beat = self._beat
        silent = time.monotonic() - beat if beat is not None else 0.0
        if silent > self.stuck_after_s:
            msg = (
                f"the Kafka sources loop of pipeline {self.pipeline!r} has not turned for "
                f"{silent:.0f} s (over {self.stuck_after_s:g} s): something blocks it; "
                "reporting unhealthy so that Serve replaces the replica"
            )
            raise RuntimeError(msg)
