"""The sink contract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from eventbus.errors import EventBusError
from eventbus.eventing._event import CloudEvent

__all__ = ["Sink", "SinkEncodeError", "SinkPartialError", "SinkTooLargeError"]


class Sink(ABC):
    """Where a pipeline's output (or dead-letter) events go.

    A sink is durable on return: :meth:`send` returns only once the destination has
    acknowledged every item, so the caller may then commit its own input position. Sources
    own their sinks' lifecycle: they call :meth:`start` before the first send and :meth:`stop`
    after the last.
    """

    async def start(self) -> None:
        """Connect. Called once before the first :meth:`send`; a no-op by default."""

    async def stop(self) -> None:
        """Flush and disconnect. A no-op by default."""

    async def positions(self) -> dict[int, int] | None:
        """Lower bounds of where the next items will land, per partition, or None when the
        destination cannot be searched (then a crash between an acknowledgement and the dedupe
        mark can let one batch through twice). See :meth:`written_keys`."""
        return None

    async def written_keys(self, positions: dict[int, int]) -> set[str]:
        """The dedupe keys (CloudEvent ``source`` + ``id``) of everything written at or after
        ``positions`` (as returned by :meth:`positions` earlier). Only called when that did not
        return None."""
        raise NotImplementedError

    @abstractmethod
    async def send(self, items: Sequence[tuple[CloudEvent, bytes | None]]) -> None:
        """Deliver events and wait until every one is acknowledged.

        Args:
            items: ``(event, key)`` pairs; ``key`` is the input record's key (or None), used
                for partitioning unless the event carries a ``partitionkey`` extension.

        Raises:
            SinkEncodeError: some items cannot be encoded; nothing was sent.
            SinkTooLargeError: the destination rejected what was sent as too large, without
                saying which item; other items of the call may have been delivered.
            SinkPartialError: the destination answered per item (an HTTP subscriber):
                some items were acknowledged, some refused for good (dead-letter them), the
                rest are to be sent again (after ``retry_after_s`` at the earliest).
            Exception: the destination did not acknowledge every item; nothing may be
                assumed delivered, and the caller retries (at-least-once).
        """


class SinkEncodeError(EventBusError, ValueError):
    """Some events could not be encoded for the destination; nothing was sent.

    Retrying cannot help these events (the source dead-letters them and sends the rest).

    Args:
        sink: what the sink writes to (a topic name, a URL).
        failures: per failing item's index in the ``send`` call, ``(error type, message)``.
    """

    def __init__(self, sink: str, failures: dict[int, tuple[str, str]]) -> None:
        super().__init__(sink, failures)
        self.sink = sink
        self.failures = failures

    def __str__(self) -> str:
        first = next(iter(self.failures.items()), None)
        detail = f"; item {first[0]}: {first[1][0]}: {first[1][1]}" if first else ""
        return (
            f"{len(self.failures)} events could not be encoded for {self.sink}{detail}; "
            "outputs must be CloudEvents whose data is JSON-serialisable or bytes"
        )


class SinkTooLargeError(EventBusError, ValueError):
    """The destination rejected a send as too large (Kafka's ``MESSAGE_SIZE_TOO_LARGE``, an
    HTTP 413), without saying which item; items of the same call may have been delivered.

    Retrying the same items fails the same way: the source sends them in smaller groups until
    the item that is too large alone is found, and dead-letters its input. Items delivered by
    the rejected call may then be written twice (at-least-once; dedupe suppresses them).

    Args:
        sink: what the sink writes to (a topic name, a URL).
        detail: the destination's answer.
    """

    def __init__(self, sink: str, detail: str) -> None:
        super().__init__(sink, detail)
        self.sink = sink
        self.detail = detail

    def __str__(self) -> str:
        return (
            f"{self.sink} rejected a send as too large ({self.detail}); send large payloads "
            "by reference (a URL in data)"
        )


class SinkPartialError(EventBusError):
    """A send that the destination answered per item: some items acknowledged, some refused
    for good, the rest not acknowledged (to be sent again).

    Raised by sinks that deliver items one by one (HTTP): the caller dead-letters the refused
    items' inputs, sends only ``pending`` again, after at least ``retry_after_s`` (the
    destination's ``Retry-After``, when it gave one), and counts everything else as delivered.

    Args:
        sink: what the sink writes to (a URL without its query).
        refused: per refused item's index in the ``send`` call, ``(error type, message)``.
        pending: indexes of the items not acknowledged, in order.
        detail: the last retryable failure (``503 Service Unavailable``, ``ReadTimeout``).
        retry_after_s: the destination's ``Retry-After`` in seconds, or None.
        attributes: per refused item, extension attributes for its dead letter
            (``ebhttpstatus``, ``ebhttpbody``).
    """

    def __init__(
        self,
        sink: str,
        refused: dict[int, tuple[str, str]],
        pending: list[int],
        detail: str,
        retry_after_s: float | None = None,
        attributes: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(sink, refused, pending, detail, retry_after_s, attributes)
        self.sink = sink
        self.refused = refused
        self.pending = pending
        self.detail = detail
        self.retry_after_s = retry_after_s
        self.attributes = dict(attributes or {})

    def __str__(self) -> str:
        after = f", Retry-After {self.retry_after_s:g} s" if self.retry_after_s is not None else ""
        return (
            f"{self.sink}: {len(self.pending)} events not acknowledged ({self.detail}{after}), "
            f"{len(self.refused)} refused; the pending ones are sent again"
        )
