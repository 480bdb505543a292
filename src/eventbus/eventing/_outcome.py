"""Per-event outcomes of one dispatched batch, and the dispatch contract.

A source hands a batch of events to a *dispatch* callable and gets back one outcome per input
event, in order: a list of output events (empty when the event was filtered out) or a
:class:`Failure`. Sources know nothing of Ray Serve: the runtime hands them a dispatch callable,
so a source can be tested with a plain async function.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeAlias

from eventbus.eventing._event import CloudEvent

__all__ = ["Dispatch", "Failure", "Outcome"]


@dataclass(frozen=True, slots=True)
class Failure:
    """One event failed in a step.

    Attributes:
        step: the id of the step that failed.
        error_type: the exception's type name.
        message: the exception's message.
        attempts: how many times the step was tried on this event.
    """

    step: str
    error_type: str
    message: str
    attempts: int = 1


#: One input event's outcome: its output events (possibly none) or its failure.
Outcome: TypeAlias = "list[CloudEvent] | Failure"

#: A batch in, one outcome per event out (same order, same length).
Dispatch: TypeAlias = Callable[[list[CloudEvent]], Awaitable[list[Outcome]]]
