"""The step contract: what a step kind builds and what the runner, the replicas and the
metrics expect of it.

A step is batch-first: :meth:`Step.process` takes the batch and returns one
:data:`StepResult` per input event, in order. A kind registers its factory with
:data:`eventbus.registry.steps`::

    @steps.register("upper", config=UpperConfig, description="Upper-case a data field.")
    def build(step_id: str, config: UpperConfig, context: StepContext) -> Step:
        return UpperStep(step_id, config)

Traits a kind may declare at registration (all optional):

- ``pure=True``: no I/O, a few µs per event; a replica may run small batches on its loop.
- ``expressions=fn``: ``fn(raw) -> [(loc, source, output)]``, the CEL expressions in the raw
  YAML value of the kind (``loc`` relative to it), so ``validate`` reports them by position
  (``output="sql"``: a CloudEvents SQL expression instead).
- ``imports=fn``: ``fn(raw) -> [(loc, "module:attr")]``, references ``validate`` imports.
- ``models=fn``: ``fn(config) -> [model refs]``, the models the step calls (deployed first).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure

__all__ = ["ERRORED", "Errored", "Fired", "Step", "StepContext", "StepResult", "Timer"]


class Errored:
    """The result of an event a step dropped because its expression could not be evaluated
    on it (a filter whose CEL fails on a missing field fails closed): counted in the step's
    ``errors``, not ``filtered``. Use the one instance, :data:`ERRORED`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ERRORED"


#: See :class:`Errored`.
ERRORED = Errored()

#: One input event's result in a step: the event it became, ``None`` (dropped: counted as
#: the step's :attr:`Step.drop_reason`), several events (a list; empty: dropped likewise),
#: :data:`ERRORED` (dropped on an evaluation error), or a :class:`~eventbus.Failure`.
StepResult: TypeAlias = "CloudEvent | list[CloudEvent] | Failure | Errored | None"


@dataclass(frozen=True)
class StepContext:
    """Where a step runs, handed to its factory.

    Attributes:
        pipeline: the pipeline's name (state keys are per pipeline and step).
        redis_url: the runtime's Redis (None: in process, as ``eventbus test`` runs; state
            stays in memory and models load from their files).
        base_dirs: folders relative data files are read from (the pipeline file's folder).
        dedupe_window_s: the pipeline's ``delivery.dedupe.window_s`` (None: no dedupe); a
            stateful step remembers the events it applied for that long, so a batch replayed
            after a crash is not applied twice.
        exactly_once: the pipeline's ``delivery.guarantee`` is ``exactly_once`` (Kafka
            transactions): a stateful step emits only as outputs of consumed events.
    """

    pipeline: str = ""
    redis_url: str | None = None
    base_dirs: list[str] = field(default_factory=list)
    dedupe_window_s: float | None = None
    exactly_once: bool = False

    @property
    def remote(self) -> bool:
        """True on a replica of the running platform (not in process)."""
        return self.redis_url is not None


@dataclass
class Fired:
    """What a :class:`Timer` produced: outputs for the sink, events for the dead-letter sink,
    and a token handed back to :meth:`Timer.ack` once both are delivered."""

    outputs: list[CloudEvent] = field(default_factory=list)
    dead: list[CloudEvent] = field(default_factory=list)
    token: Any = None
    #: the timer stopped at its limit with more work due: fire again at once
    more: bool = False


class Timer(ABC):
    """Work a step does without an incoming event (closing join windows, re-solving a plan),
    run by the replica every ``interval_s`` on a worker thread."""

    interval_s: float = 1.0
    #: the index in the pipeline of the step that owns the timer (set by the runner and
    #: ``pipeline_timers``): what it fires runs through the steps after that one
    step_index: int = -1

    @abstractmethod
    def fire(self) -> Fired | None:
        """Do one round; return what to deliver (None: nothing)."""

    def ack(self, fired: Fired) -> None:
        """``fired``'s outputs and dead letters were delivered."""

    def wake_with(self, wake: Callable[[], None]) -> None:
        """Whoever fires the timer gives it ``wake``: calling it, from any thread, asks for a
        round now rather than at the next ``interval_s`` (an aggregate step calls it once a
        batch moved its watermark past a window's close). Default: not used."""


class Step(ABC):
    """A batch-first pipeline step.

    Args:
        step_id: the step's id, carried into failures, logs and metrics.
    """

    #: the registered kind (``filter``, ``join``...), set by each step class
    kind: ClassVar[str] = ""
    #: no I/O and cheap: small batches may run on the replica's event loop
    pure: ClassVar[bool] = False
    #: process() waits on another service (a model's deployment): the replica runs its
    #: batches on worker threads, so batches in flight overlap
    blocking: ClassVar[bool] = False
    #: process() waits on its state store (an aggregate's Redis script) for much of a batch:
    #: the replica runs the batches on one worker thread, one at a time and in order, so its
    #: event loop fetches and delivers meanwhile (``serving._step_threads``)
    offload: ClassVar[bool] = False
    #: what an input that gave no output (``None`` or ``[]``) counts as in the step's
    #: figures: ``filtered`` (a predicate said no) or ``absorbed`` (held in state: a join
    #: waiting for its partner, an aggregate's window)
    drop_reason: ClassVar[str] = "filtered"
    #: failure types (:attr:`Failure.error_type`) counted as ``late``, not ``errors``
    late_errors: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, step_id: str) -> None:
        self.id = step_id
        self.errors = 0  # events this step failed or (filters) could not evaluate

    @property
    def template(self) -> str:
        """The kind's name (the metrics' ``template`` label)."""
        return self.kind

    @abstractmethod
    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        """One result per input event, in order."""

    def uses_origins(self) -> bool:
        """True when the step wants each event's source partition (:meth:`process_from`):
        a join on event time keeps its watermark per partition."""
        return False

    def process_from(self, events: list[CloudEvent], origins: list[str] | None) -> list[StepResult]:
        """:meth:`process` given each event's source partition (``<topic>[<partition>]``;
        None when unknown). Called instead of :meth:`process` when :meth:`uses_origins`."""
        return self.process(events)

    def stats(self) -> dict[str, Any] | None:
        """Figures of the step's own state (join keys, model version...), or None."""
        return None

    def timers(self) -> list[Timer]:
        """The step's timers (none by default)."""
        return []

    def flush(self) -> list[CloudEvent]:
        """End of the input (``eventbus test``, ``run_pipeline``): close what is open (an
        aggregate step's windows) and return its events (none by default)."""
        return []

    def _failure(self, exc: BaseException, attempts: int = 1) -> Failure:
        self.errors += 1
        message = getattr(exc, "message", None) or str(exc) or repr(exc)
        return Failure(
            step=self.id, error_type=type(exc).__name__, message=message, attempts=attempts
        )
