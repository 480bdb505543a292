"""The timer of an ``aggregate`` step: it closes windows due by the watermark, which also
advances with the wall clock while no events come (so idle windows close)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from eventbus.eventing._event import CloudEvent
from eventbus.pipelines._step import Fired, Timer
from eventbus.pipelines.steps._aggregate_ops import Window

__all__ = ["AggregateTimer", "ClosingStep"]


class ClosingStep(Protocol):
    """What the timer needs of its step (:class:`~._aggregate.AggregateStep` is one)."""

    state: Any
    counters: dict[str, int]
    wake: Callable[[], None] | None

    def now(self) -> int: ...

    def output(self, w: Window, *, update: bool = False) -> CloudEvent: ...


class AggregateTimer(Timer):
    """Closes due windows of an aggregate step and emits them (claimed with a lease: a timer
    that dies mid-way is replaced once the lease runs out, re-emitting the same ids).

    Args:
        step: the aggregate step.
        lease_s: how long a claim holds.
    """

    interval_s = 0.5

    def __init__(self, step: ClosingStep, lease_s: float = 30.0) -> None:
        self.step = step
        self._lease_ms = int(lease_s * 1000)

    def close(self, now: int | None = None, limit: int = 5000) -> Fired:
        """Claim the windows due now: their events, and the claims as the token."""
        step = self.step
        windows = step.state.claim(step.now() if now is None else now, self._lease_ms, limit)
        step.counters["windows_emitted"] += len(windows)
        outputs = [step.output(w) for w in windows]
        return Fired(outputs, [], [w.wid for w in windows], more=len(windows) >= limit)

    def fire(self) -> Fired | None:
        """One :meth:`close`; None when nothing closed."""
        fired = self.close()
        return fired if fired.token else None

    def ack(self, fired: Fired) -> None:
        """Forget the delivered windows."""
        self.step.state.ack(fired.token)

    def wake_with(self, wake: Callable[[], None]) -> None:
        """The step calls ``wake`` once a batch moved its watermark past a window's close
        deadline: the window is emitted then, not up to ``interval_s`` later."""
        self.step.wake = wake
