"""The sink contract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from eventbus.eventing._event import CloudEvent

__all__ = ["Sink"]


class Sink(ABC):
    """Where a pipeline's output (or dead-letter) events go.

    A sink is durable on return: :meth:`send` returns only once the destination has
    acknowledged every item, so the caller may then commit its own input position. Sources
    own their sinks' lifecycle: they call :meth:`start` before the first send and :meth:`stop`
    after the last.
    """

    async def start(self) -> None:  # noqa: B027 - documented no-op hook
        """Connect. Called once before the first :meth:`send`; a no-op by default."""

    async def stop(self) -> None:  # noqa: B027 - documented no-op hook
        """Flush and disconnect. A no-op by default."""

    @abstractmethod
    async def send(self, items: Sequence[tuple[CloudEvent, bytes | None]]) -> None:
        """Deliver events and wait until every one is acknowledged.

        Args:
            items: ``(event, key)`` pairs; ``key`` is the input record's key (or None), used
                for partitioning unless the event carries a ``partitionkey`` extension.

        Raises:
            Exception: the destination did not acknowledge every item; nothing may be
                assumed delivered, and the caller retries (at-least-once).
        """
