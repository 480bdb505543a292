"""The ``aggregate`` step: count, sum, min, max, avg, first, last, collect, distinct and CEL
reducers per key over tumbling, hopping or session windows.

Per batch the step evaluates the key and each aggregation's CEL per event, folds the events
of each (key, window) into partials in Python and merges them into the state in one atomic
call (a Lua script in Redis, :mod:`._aggregate_lua`; :class:`MemoryAggregateState` in
process), so any replica serves any key. The state keeps the watermark (the latest event
time merged; with ``time: processing`` the wall clock); an event whose windows closed by it
(end + ``allowed_lateness_s``) fails with :class:`AggregateLateEventError`, counted. The
:class:`AggregateTimer` closes windows: those due by the watermark, which also advances with
the wall clock while no events come, so idle windows close too. Each closed window is one
event with a deterministic id (pipeline, step, key, window), so a window emitted again after
a crash is dropped by the sink's dedupe.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from eventbus import cel
from eventbus.eventing._delivery import injected_fault
from eventbus.eventing._event import CloudEvent, time_ms, utc_ms
from eventbus.pipelines._step import Step, StepContext, Timer
from eventbus.pipelines.steps._aggregate_close import (
    CLOSE_LIMIT,
    REPLAY_S,
    exactly_once_refusal,
)
from eventbus.pipelines.steps._aggregate_config import AggregateConfig
from eventbus.pipelines.steps._aggregate_items import build_items
from eventbus.pipelines.steps._aggregate_ops import (
    Item,
    MemoryAggregateState,
    Seen,
    Window,
)
from eventbus.pipelines.steps._aggregate_output import window_event
from eventbus.pipelines.steps._aggregate_program import compile_aggregate
from eventbus.pipelines.steps._join_output import format_time_ms
from eventbus.pipelines.steps._join_state import now_ms
from eventbus.registry import steps

__all__ = ["AggregateLateEventError", "AggregateStep"]


class AggregateLateEventError(ValueError):
    """An event came after its windows closed (window end + allowed lateness)."""


class AggregateStep(Step):
    """The runtime of an ``aggregate`` step (see the module docstring).

    Args:
        step_id: the step id.
        spec: the aggregate configuration.
        pipeline: the pipeline name (state keys, output ids and source).
        redis_url: the state store; None keeps state in memory (pipeline tests).
        dedupe_window_s: ``delivery.dedupe.window_s``: the state remembers each applied
            event (``source`` + ``id``) this long, in the same atomic call as the merge, so a
            batch replayed after a crash (applied, not committed) is not counted twice.
        exactly_once: ``delivery.guarantee`` is ``exactly_once`` (with Redis state): the
            batches close the windows, no timer (see :mod:`._aggregate_close`).
    """

    kind = "aggregate"
    offload = True  # one Redis script per batch: the replica overlaps it with fetch and send
    drop_reason = "absorbed"  # merged into a window, emitted when the window closes
    late_errors = frozenset({"AggregateLateEventError"})

    def __init__(
        self,
        step_id: str,
        spec: AggregateConfig,
        *,
        pipeline: str,
        redis_url: str | None = None,
        dedupe_window_s: float | None = None,
        exactly_once: bool = False,
    ) -> None:
        super().__init__(step_id)
        self.spec, self.pipeline = spec, pipeline
        #: the batches close the windows (exactly_once on Redis state), not the timer
        self.closing = bool(exactly_once and redis_url)
        #: exactly_once: the most windows one batch closes (a bounded Redis script)
        self.close_limit = CLOSE_LIMIT
        if self.closing:
            dedupe_window_s = max(dedupe_window_s or 0.0, REPLAY_S)
        self.dedupe_ms = None if dedupe_window_s is None else int(dedupe_window_s * 1000)
        #: the compiled configuration, shared with the items and the window events
        self.program = program = compile_aggregate(step_id, spec, pipeline)
        self.names, self.state_spec = program.names, program.state_spec
        self.size_ms, self.advance_ms = program.size_ms, program.advance_ms
        if redis_url:
            from eventbus.pipelines.steps._aggregate_lua import RedisAggregateState

            self.state: Any = RedisAggregateState(redis_url, pipeline, step_id, self.state_spec)
        else:
            self.state = MemoryAggregateState(self.state_spec)
        #: the timer's wake (see :meth:`AggregateTimer.wake_with`), called from
        #: :meth:`process` when windows came due; the watermark this step merged and the
        #: earliest close deadline of the windows it merged since (event time)
        self.wake: Callable[[], None] | None = None
        self._wm: int | None = None
        self._next_due: int | None = None
        self.counters = dict.fromkeys(
            (
                "windows_emitted",
                "updates_emitted",
                "late_events",
                "late_windows",
                "collect_truncated",
                "reducer_truncated",
                "reducer_errors",
                "duplicate_events",
            ),
            0,
        )

    @staticmethod
    def now() -> int:
        """The step's clock, wall-clock milliseconds (tests move it)."""
        return now_ms()

    def process(self, events: list[CloudEvent]) -> list[Any]:
        """Merge the batch into its windows; per event [] (absorbed), an update event
        (``emit: update``, on the last event of each changed window) or a failure.

        Raises:
            StateUnavailableError: the state store does not answer (the batch is retried).
        """
        results: list[Any] = [[] for _ in events]
        rows: list[tuple[int, str, int, list[Any]]] = []
        now = self.now()
        processing = self.state_spec.processing
        acts: dict[int, dict[str, Any]] = {}
        program = self.program
        build, key_of, getters = program.build, program.key, program.getters
        shared: dict[str, Any] | None = {} if program.shared_act else None
        keep = program.reducers
        for i, e in enumerate(events):
            try:
                if shared is None:
                    act = build(e)
                else:
                    act = shared
                    act["data"] = e.data
                key = key_of(act)
                if key.__class__ is not str:
                    if key.__class__ is not int:  # a bool is not an int here
                        msg = f"aggregate key {self.spec.key!r} gave {key!r} ({type(key).__name__}); a key must be a string or an integer"
                        raise TypeError(msg)
                    key = str(key)
                elif "\0" in key:
                    msg = f"aggregate key {self.spec.key!r} gave {key!r}, which holds a NUL character (the state separates its fields with it); build the key without it"
                    raise ValueError(msg)
                if processing:
                    t = now
                else:
                    text = e.attributes.get("time")
                    ms = utc_ms(text) if text.__class__ is str else None
                    t = _event_ms(e) if ms is None else ms
                vals = [None if g is None else g(act) for g in getters]
            except (cel.CELError, ValueError, TypeError) as exc:
                results[i] = self._failure(exc)
                continue
            rows.append((i, key, t, vals))
            if keep:
                acts[i] = act
        rows = self._late_in_batch(events, results, rows)
        if not rows:
            return results
        seen = self._seen(events, rows)
        closed: dict[int, list[Window]] = {}
        while True:
            items, failed = build_items(program, rows, acts, events)
            for i, error in failed.items():
                results[i] = self._failure(error)
            if not items:
                return self._closed(results, closed)
            if self.closing:
                assert seen is not None
                lates, updates, dups, by = self.state.add_closing(
                    now, items, seen, self.close_limit
                )
                closed.update(by)
            else:
                lates, updates, dups = self.state.add(now, items, seen)
            if not dups:
                # test hook: die between the state update and the batch's commit
                injected_fault(self.pipeline, "aggregate-applied")
                break
            # Applied before (a batch replayed after a crash): absorbed, counted, and the
            # batch folded again without them.
            self.counters["duplicate_events"] += len(dups)
            gone = set(dups)
            rows = [r for r in rows if r[0] not in gone]
        self._lateness(events, results, items, lates)
        self._wake_if_due(items, lates)
        for it, w in zip(items, updates):
            if w is not None:
                self.counters["updates_emitted"] += 1
                results[max(it.events)].append(self.output(w, update=True))
        return self._closed(results, closed)

    def _closed(self, results: list[Any], closed: dict[int, list[Window]]) -> list[Any]:
        # exactly_once: the windows an event closed are its outputs (its batch's transaction)
        for i, windows in closed.items():
            self.counters["windows_emitted"] += len(windows)
            results[i].extend(self.output(w) for w in windows)
        return results

    def _wake_if_due(self, items: list[Item], lates: list[bool]) -> None:
        # Event time: once the batch moved the watermark past the earliest close deadline
        # (end + allowed lateness) of the windows merged here, the timer runs now instead of
        # at its next tick (up to interval_s later). A hint: the tick still closes every
        # window (other replicas', the clock's), this only brings the close forward.
        if self.wake is None or self.state_spec.processing:
            return
        lateness = self.state_spec.lateness_ms
        wm, nxt = self._wm, self._next_due
        for it, late in zip(items, lates):
            if not late:
                if wm is None or it.max_t > wm:
                    wm = it.max_t
                if nxt is None or it.end + lateness < nxt:
                    nxt = it.end + lateness
        if wm is not None and nxt is not None and wm >= nxt:
            self.wake()
            ahead = [it.end + lateness for it, late in zip(items, lates) if not late]
            nxt = min((d for d in ahead if d > wm), default=None)
        self._wm, self._next_due = wm, nxt

    def _seen(self, events: list[CloudEvent], rows: list[Any]) -> Seen | None:
        if self.dedupe_ms is None:
            return None
        digests: dict[int, str] = {}
        for i, *_ in rows:
            a = events[i].attributes
            basis = f"{a.get('source', '')}\x00{a.get('id', '')}".encode()
            # 24 hex characters: the add script reads the batch's digests at that width
            digests[i] = hashlib.blake2b(basis, digest_size=12).hexdigest()
        return Seen(digests, self.dedupe_ms)

    def _late_in_batch(
        self, events: list[CloudEvent], results: list[Any], rows: list[Any]
    ) -> list[Any]:
        # Tumbling and hopping: an event is late by the events before it in its batch too, as
        # if the batch came one event at a time (the state judges it by the batches before).
        if self.state_spec.gap_ms or self.state_spec.processing:
            return rows
        times = [r[2] for r in rows]
        if times == sorted(times):
            # in time order (the usual stream): no event is late by the ones before it, as
            # each window ends after its event; one C sort instead of a loop per event
            return rows
        kept, seen = [], None
        lateness = self.state_spec.lateness_ms
        for row in rows:
            i, key, t, _ = row
            last_start = t - t % self.advance_ms
            if seen is not None and last_start + self.size_ms + lateness <= seen:
                it = Item(key, last_start, last_start + self.size_ms, t, 1, [], [i])
                self._late(events, results, i, it)
                continue
            seen = t if seen is None else max(seen, t)
            kept.append(row)
        return kept

    def _lateness(
        self, events: list[CloudEvent], results: list[Any], items: list[Item], lates: list[bool]
    ) -> None:
        on_time: set[int] = set()
        late: dict[int, Item] = {}
        for it, is_late in zip(items, lates):
            if is_late:
                self.counters["late_windows"] += len(it.events)
                for i in it.events:
                    late[i] = it
            else:
                on_time.update(it.events)
        for i, it in late.items():
            if i in on_time:
                continue  # a hopping event whose later windows are still open
            self.counters["late_windows"] -= 1
            self._late(events, results, i, it)

    def _late(self, events: list[CloudEvent], results: list[Any], i: int, it: Item) -> None:
        self.counters["late_events"] += 1
        lateness = self.spec.allowed_lateness_s
        msg = (
            f"event time {events[i].attributes.get('time', '(processing)')} is late for key {it.key!r}: its window "
            f"[{format_time_ms(it.start)}, {format_time_ms(it.end)}) closed once the step's watermark passed its end "
            f"+ allowed_lateness_s ({lateness:g} s); raise allowed_lateness_s to take events this late"
        )
        results[i] = self._failure(AggregateLateEventError(msg))

    def output(self, w: Window, *, update: bool = False) -> CloudEvent:
        """The event of a window's values (``update``: an intermediate one)."""
        return window_event(self.program, self.counters, w, update=update)

    def stats(self) -> dict[str, Any]:
        return {**self.counters, **self.state.figures()}

    def timers(self) -> list[Timer]:
        """The timer that closes this step's windows (none under exactly_once: its batches
        close them)."""
        from eventbus.pipelines.steps._aggregate_timer import AggregateTimer

        return [] if self.closing else [AggregateTimer(self)]

    def flush(self) -> list[CloudEvent]:
        """End of input: close and emit every open window; the watermark starts afresh (the
        next input, e.g. ``eventbus test``'s next case, is not late by this one)."""
        from eventbus.pipelines.steps._aggregate_timer import AggregateTimer

        timer = AggregateTimer(self)
        fired = timer.close(now=2**52)
        timer.ack(fired)
        self.state.forget_watermark()
        self._wm = self._next_due = None
        return fired.outputs


def _event_ms(e: CloudEvent) -> int:
    t = e.attributes.get("time")
    if not t:
        msg = f"event {e.attributes.get('id')!r} has no 'time' attribute; aggregate with time: event windows by it: set it at the source, or use time: processing"
        raise ValueError(msg)
    return time_ms(t)


def _expressions(raw: Any) -> list[tuple[tuple[int | str, ...], str, bool]]:
    out: list[tuple[tuple[int | str, ...], str, bool]] = []
    if not isinstance(raw, dict):
        return out
    if isinstance(raw.get("key"), str) and raw["key"]:
        out.append((("key",), raw["key"], False))
    aggs = raw.get("aggregations")
    for name, agg in aggs.items() if isinstance(aggs, dict) else []:
        if isinstance(agg, dict):
            for op in ("sum", "min", "max", "avg", "first", "last", "distinct", "collect"):
                if isinstance(agg.get(op), str) and agg[op]:
                    out.append((("aggregations", name, op), agg[op], False))
    return out


@steps.register(
    "aggregate",
    config=AggregateConfig,
    description="Aggregate events per key over tumbling, hopping or session windows (state in Redis).",
    expressions=_expressions,
    timers=True,
    ordered=True,  # the watermark (lateness, window closes) follows the order of the events
    # delivery.guarantee exactly_once: the batches close the windows (see _aggregate_close)
    exactly_once=exactly_once_refusal,
    example={
        "key": "string(data.id)",
        "window": {"tumbling": {"size_s": 60}},
        "time": "processing",
        "aggregations": {"n": "count", "total": {"sum": "data.amount"}},
    },
)
def build_aggregate(step_id: str, config: AggregateConfig, context: StepContext) -> AggregateStep:
    """An aggregate step (state in Redis on the platform, in memory in process)."""
    return AggregateStep(
        step_id,
        config,
        pipeline=context.pipeline,
        redis_url=context.redis_url,
        dedupe_window_s=context.dedupe_window_s,
        exactly_once=context.exactly_once,
    )
