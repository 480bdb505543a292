"""One lock per pipeline for the controller's reconcilers.

Deploys and deletes come from callers, scale decisions from the scale-to-zero watcher's
threads, promotions from the canary thread. Each changes one pipeline's Serve application and
record, and two changes of the same pipeline must not overlap (a ``serve.run`` of an
application being deleted never returns); changes of two pipelines may. So each pipeline has
its own lock, and a wake-up of one pipeline does not wait behind another's scale-down (which
blocks while the replicas drain). What pipelines share keeps its own lock: a shared host's
membership (``_host_control.Hosts``) and Serve's pace (``_serve_apps.ServePace``).
"""

from __future__ import annotations

import threading
import weakref

__all__ = ["SERVE_RUN", "PipelineLocks"]

#: Held around every ``serve.run`` of this process (deploys, wake-ups, hosts, models): Ray
#: Serve 2.60's ``serve.run`` is not thread-safe (it registers modules for pickling by value
#: while it serializes a config, and unregisters them after: two at once fail with "... is not
#: registered for pickle by value"). Taken after a pipeline's lock, never before one.
SERVE_RUN = threading.RLock()


class PipelineLocks:
    """Re-entrant locks by pipeline name (re-entrant: a rollback deploys under its lock).

    A lock lives while someone holds or waits for it (a weak mapping): deleted pipelines
    leave nothing behind, and two callers asking for the same name at once get one lock.
    Hold one with ``with locks.of(name):`` (which refers to it until its end), never by
    ``acquire()`` on a lock nobody keeps.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: weakref.WeakValueDictionary[str, threading.RLock] = (
            weakref.WeakValueDictionary()
        )

    def of(self, name: str) -> threading.RLock:
        """The lock of pipeline ``name`` (hold it with ``with locks.of(name):``)."""
        with self._guard:
            lock = self._locks.get(name)
            if lock is None:
                lock = threading.RLock()
                self._locks[name] = lock
            return lock

    def __len__(self) -> int:
        """How many pipelines' locks are alive (held, waited for or referenced)."""
        with self._guard:
            return len(self._locks)
