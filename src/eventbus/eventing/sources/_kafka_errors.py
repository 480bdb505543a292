"""Which failures of a Kafka source's dispatch and sinks can succeed later, and how long to wait.

Nothing is retried forever:

* an *infrastructure* error (a replica or the broker unreachable, Redis down, a Ray actor
  that died: :func:`is_infrastructure`) says nothing about the events; the call is retried
  with the delivery backoff for at most ``DeliveryPolicy.give_up_s`` (default
  :data:`GIVE_UP_S`, 5 minutes: longer than a replica, broker or Redis restart takes, short
  enough that a dead dependency shows). Past it the source stops with
  :class:`SourceStalledError`; nothing past the stuck batch was committed, so its events are
  consumed again by whoever takes the partitions next (at-least-once), and a replica whose
  sources stopped reports itself unhealthy so that Serve replaces it;
* any other dispatch error is taken as deterministic for the batch (a poison event, an
  unpicklable value): after ``dispatch_retries`` tries the batch is split in halves, down to
  the events that fail alone, which are dead-lettered (``ebstep: dispatch``);
* a record the sink rejects as too large (:class:`~eventbus.eventing.sinks.SinkTooLargeError`,
  aiokafka's ``MessageSizeTooLargeError`` / ``RecordListTooLargeError``) or cannot encode can
  never be sent: its input is dead-lettered and the partition moves on.
"""

from __future__ import annotations

import asyncio

from eventbus.errors import EventBusError, StateUnavailableError

__all__ = ["GIVE_UP_S", "SourceStalledError", "is_infrastructure"]

#: Default bound on retrying an infrastructure failure of a dispatch or a sink send.
GIVE_UP_S = 300.0

# Ray's errors by class name: eventing never imports Ray. RayTaskError (a user error raised
# inside a Ray task) is not among them: it subclasses the user's own exception type.
_RAY_INFRASTRUCTURE = frozenset(
    (
        "RayActorError",
        "ActorDiedError",
        "ActorUnavailableError",
        "ActorUnschedulableError",
        "RaySystemError",
        "WorkerCrashedError",
        "NodeDiedError",
        "ObjectLostError",
        "OwnerDiedError",
        "ObjectFetchTimedOutError",
        "ObjectStoreFullError",
        "OutOfMemoryError",
        "GetTimeoutError",
        "BackPressureError",
        "DeploymentUnavailableError",
        "RayServeException",
    )
)


def is_infrastructure(error: BaseException) -> bool:
    """Whether ``error`` says a dependency is down (retry later) rather than that the events
    cannot be processed (retrying the same events fails the same way)."""
    if isinstance(
        error, (StateUnavailableError, ConnectionError, TimeoutError, asyncio.TimeoutError)
    ):
        return True
    if getattr(error, "retriable", False):  # aiokafka's retriable errors
        return True
    return any(cls.__name__ in _RAY_INFRASTRUCTURE for cls in type(error).__mro__)


class SourceStalledError(EventBusError, RuntimeError):
    """A dispatch or a sink kept failing for longer than the source's ``give_up_s``.

    Args:
        pipeline: the pipeline.
        what: what kept failing (``dispatch``, ``sink``, ``dead_letter``).
        seconds: how long it was retried.
        error: the last error, as ``Type: message``.
    """

    def __init__(self, pipeline: str, what: str, seconds: float, error: str) -> None:
        super().__init__(pipeline, what, seconds, error)
        self.pipeline = pipeline
        self.what = what
        self.seconds = seconds
        self.error = error

    def __str__(self) -> str:
        return (
            f"kafka source of pipeline {self.pipeline!r}: {self.what} kept failing for "
            f"{self.seconds:.0f} s (last error {self.error}); giving up: the source stops "
            "without committing the batch, whose events are consumed again once the "
            f"{self.what} is back (check it; the bound is delivery give_up_s)"
        )
