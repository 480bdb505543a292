"""The step runner: a batch of events through every step, one outcome per input event."""

from __future__ import annotations

import logging
import time
from time import perf_counter
from typing import Any

from eventbus.errors import StateUnavailableError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure, Outcome
from eventbus.observability._metrics import (
    BATCH_SIZE_BOUNDS,
    LATENCY_BOUNDS_S,
    Histogram,
    StepCounters,
)
from eventbus.pipelines._build import build_step
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._step import ERRORED, Step, Timer

__all__ = ["PipelineRunner"]

log = logging.getLogger("eventbus.pipelines.runner")
#: Failed events logged one by one per batch and step (the rest: one summary line).
_LOG_FAILURES_PER_BATCH = 5


class PipelineRunner:
    """Runs a pipeline's steps over batches, in process (the Serve replica wraps one).

    Args:
        config: the validated pipeline.
        redis_url: where ``join``/``allocate`` steps keep their state (None: in memory, for tests).
        base_dirs: where relative data files of steps are read (the pipeline file's folder).

    Example:
        >>> runner = PipelineRunner(config)               # doctest: +SKIP
        >>> outcomes = runner.run([event1, event2])      # doctest: +SKIP
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        redis_url: str | None = None,
        base_dirs: list[str] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        dedupe = config.spec.delivery.dedupe
        self.steps: list[Step] = [
            build_step(
                s,
                pipeline=config.name,
                redis_url=redis_url,
                base_dirs=base_dirs,
                dedupe_window_s=dedupe.window_s if dedupe is not None else None,
                exactly_once=config.spec.delivery.guarantee == "exactly_once",
            )
            for s in config.spec.steps
        ]
        #: every step is of a pure kind (filter, convert): in-memory work of a few µs per
        #: event, no I/O, nothing that blocks (a caller may run small batches on its loop)
        self.pure = all(step.pure for step in self.steps)
        #: some step keeps state per source partition (an event-time join's watermark):
        #: callers that know each event's partition pass ``origins`` to :meth:`run`
        self.uses_origins = any(step.uses_origins() for step in self.steps)
        #: some step's state depends on the order of its events (its kind is registered
        #: ``ordered=True``: join, aggregate): the batches after one whose dispatch failed wait
        #: for its retry
        #: (``FetchSettings.in_order``, :attr:`PipelineConfig.in_order`)
        self.in_order = config.in_order
        # Observability, updated once per batch (see eventbus.observability).
        self.counters: list[StepCounters] = [StepCounters() for _ in self.steps]
        self.batch_sizes = Histogram(BATCH_SIZE_BOUNDS)
        self.batch_seconds = Histogram(LATENCY_BOUNDS_S)
        #: events the steps' timers emitted that came out of the last step (delivered as the
        #: pipeline's outputs, beside the sources' ones)
        self.timer_outputs = 0
        #: when the last batch came in (epoch s; None: none yet)
        self.last_event_at: float | None = None

    def timers(self) -> list[Timer]:
        """The steps' timers (join windows closing without an incoming event, allocate plans)."""
        out: list[Timer] = []
        for k, step in enumerate(self.steps):
            for timer in step.timers():
                timer.step_index = k
                out.append(timer)
        return out

    def run_after(self, step_index: int, events: list[CloudEvent]) -> list[Outcome]:
        """Run what step ``step_index``'s timer fired (closed windows) through the steps
        after it, like that step's outputs; one outcome per event (see :meth:`run`).

        They count as emitted by step ``step_index``, and those that come out of the last step
        as the pipeline's outputs."""
        outcomes = self.run(events, first=step_index + 1)
        if 0 <= step_index < len(self.counters):
            self.counters[step_index].emitted += len(events)
        self.timer_outputs += sum(len(o) for o in outcomes if type(o) is list)
        return outcomes

    def flush(self, *, trace: dict[str, list[CloudEvent]] | None = None) -> list[CloudEvent]:
        """End of the input (in-process runs: ``eventbus test``, ``run_pipeline``): each step
        closes what it holds open (aggregate windows); what it emits runs through the steps
        after it. Returns the events for the sink; failures there are counted per step."""
        out: list[CloudEvent] = []
        for k, step in enumerate(self.steps):
            current = step.flush()
            self.counters[k].emitted += len(current)
            if trace is not None and current:
                trace.setdefault(step.id, []).extend(current)
            for later, counters in zip(self.steps[k + 1 :], self.counters[k + 1 :]):
                if not current:
                    break
                nxt: list[CloudEvent] = []
                dropped = errors = late = 0
                for res in later.process(current):
                    if type(res) is CloudEvent:
                        nxt.append(res)
                    elif type(res) is Failure:
                        if res.error_type in later.late_errors:
                            late += 1
                        else:
                            errors += 1
                    elif res is ERRORED:
                        errors += 1
                    elif res:
                        nxt.extend(res)  # type: ignore[arg-type]
                    else:
                        dropped += 1
                _count(later, counters, dropped, errors, late)
                counters.events_in += len(current)
                counters.events_out += len(nxt)
                current = nxt
                if trace is not None:
                    trace.setdefault(later.id, []).extend(current)
            out += current
        return out

    def run(
        self,
        events: list[CloudEvent],
        *,
        trace: dict[str, list[CloudEvent]] | None = None,
        origins: list[str] | None = None,
        first: int = 0,
    ) -> list[Outcome]:
        """Run the steps over a batch.

        Args:
            events: the input batch.
            trace: when given, filled with each step's output events, by step id.
            origins: per input event, the source partition it came from
                (``<topic>[<partition>]``), for steps that keep state per partition.
            first: the index of the first step to run (the ones before are skipped).

        Returns:
            One outcome per input event, in order: its output events (empty when dropped) or a
            :class:`Failure`. A failing event never fails its batch-mates.
        """
        n = len(events)
        if n and not first:
            self.last_event_at = time.time()
        current: list[CloudEvent] = list(events)
        origin: list[int] = list(range(n))
        failed: dict[int, Failure] = {}
        started = t0 = perf_counter()
        for step, counters in zip(self.steps[first:], self.counters[first:]):
            if not current:
                if trace is not None:
                    trace[step.id] = []
                continue
            try:
                if origins is not None and self.uses_origins and step.uses_origins():
                    results = step.process_from(current, [origins[o] for o in origin])
                else:
                    results = step.process(current)
            except StateUnavailableError:
                raise  # infrastructure, not the events: the whole batch is dispatched again
            except Exception as exc:  # noqa: BLE001 - a step bug fails its events, not the replica
                f = Failure(step=step.id, error_type=type(exc).__name__, message=str(exc))
                results = [f] * len(current)
            nxt: list[CloudEvent] = []
            nxt_origin: list[int] = []
            dropped = errors = late = 0
            late_errors = step.late_errors
            newly_failed: list[int] = []
            for res, o in zip(results, origin, strict=True):
                if type(res) is CloudEvent:
                    nxt.append(res)
                    nxt_origin.append(o)
                elif res is None:
                    dropped += 1
                elif type(res) is Failure:
                    if res.error_type in late_errors:
                        late += 1
                    else:
                        errors += 1
                    if o not in failed:
                        failed[o] = res
                        newly_failed.append(o)
                elif res is ERRORED:
                    errors += 1
                else:
                    if not res:
                        dropped += 1
                    for r in res:  # type: ignore[union-attr]
                        nxt.append(r)
                        nxt_origin.append(o)
            if newly_failed:  # rare: one log line per failed event, none per good one
                self._log_failures(step.id, events, newly_failed, failed)
            t1 = perf_counter()
            counters.events_in += len(current)
            counters.events_out += len(nxt)
            _count(step, counters, dropped, errors, late)
            counters.batches += 1
            counters.seconds += t1 - t0
            t0 = t1
            current, origin = nxt, nxt_origin
            if trace is not None:
                trace[step.id] = [e for e, o in zip(current, origin) if o not in failed]
        outcomes: list[Outcome] = [[] for _ in range(n)]
        for e, o in zip(current, origin):
            if o not in failed:
                outcomes[o].append(e)  # type: ignore[union-attr]
        for o, f in failed.items():
            outcomes[o] = f
        if n:
            self.batch_sizes.observe(n)
            self.batch_seconds.observe(perf_counter() - started)
        return outcomes

    def _log_failures(
        self, step_id: str, events: list[CloudEvent], origins: list[int], failed: dict[int, Failure]
    ) -> None:
        # A step that fails every event must not turn each batch into thousands of log lines:
        # the first few events of a batch are logged one by one, the rest in one summary line.
        if len(origins) > _LOG_FAILURES_PER_BATCH:
            rest = len(origins) - _LOG_FAILURES_PER_BATCH
            f = failed[origins[-1]]
            log.warning(
                "pipeline %r: %d more events of this batch failed in step %r (last: %s: %s)",
                self.name,
                rest,
                step_id,
                f.error_type,
                f.message,
                extra={"pipeline": self.name, "step": step_id},
            )
            origins = origins[:_LOG_FAILURES_PER_BATCH]
        for o in origins:
            f = failed[o]
            event_id = events[o].attributes.get("id")
            log.warning(
                "pipeline %r: event %r failed in step %r: %s: %s",
                self.name,
                event_id,
                step_id,
                f.error_type,
                f.message,
                extra={"pipeline": self.name, "step": step_id, "event_id": event_id},
            )

    def metrics(self) -> dict[str, Any]:
        """JSON-able observability snapshot: per-step counters (with the step's own stats:
        join state size, model version...), batch sizes and batch run times."""
        steps: dict[str, Any] = {}
        for step, counters in zip(self.steps, self.counters):
            entry = counters.snapshot()
            entry["template"] = step.template
            try:
                own = step.stats()
            except Exception as exc:  # noqa: BLE001 - a state store down: report, do not fail
                own = {"error": f"{type(exc).__name__}: {exc}"}
            if own is not None:
                entry["stats"] = own
            steps[step.id] = entry
        return {
            "steps": steps,
            "timer_outputs": self.timer_outputs,
            "last_event_at": self.last_event_at,
            "batch_size": self.batch_sizes.snapshot(),
            "batch_seconds": self.batch_seconds.snapshot(),
        }

    def stats(self) -> dict[str, Any]:
        """Per-step error counts."""
        out: dict[str, Any] = {}
        for s in self.steps:
            out[s.id] = {"template": s.template, "errors": s.errors}
            own = s.stats()
            if own is not None:
                out[s.id].update(own)
        return out


def _count(step: Step, counters: StepCounters, dropped: int, errors: int, late: int) -> None:
    """Add one batch's inputs that gave no output, by reason (see ``DROP_REASONS``)."""
    if step.drop_reason == "absorbed":
        counters.absorbed += dropped
    else:
        counters.filtered += dropped
    counters.errors += errors
    counters.late += late
