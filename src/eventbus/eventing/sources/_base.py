"""The source contract."""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["Source"]


class Source(ABC):
    """Takes events from a transport and feeds them, in micro-batches, to a dispatch callable.

    The runtime calls :meth:`start`, then runs :meth:`run` as a task, and calls :meth:`stop`
    to end it; :meth:`run` returns once stopped. A source acknowledges its input (commits an
    offset, answers a caller) only after the sink and the dead-letter sink acknowledged the
    outcomes (at-least-once).
    """

    @abstractmethod
    async def start(self) -> None:
        """Connect (and start the sinks the source owns)."""

    @abstractmethod
    async def run(self) -> None:
        """Consume until :meth:`stop` is called."""

    @abstractmethod
    async def stop(self, drain: bool = True) -> None:
        """Stop consuming; with ``drain``, finish and acknowledge what is in flight first."""

    @abstractmethod
    def stats(self) -> dict[str, int]:
        """Counters since start (names depend on the source)."""
