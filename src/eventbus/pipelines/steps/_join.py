"""The ``join`` step: correlate events of several sides by key within a window.

Per batch, every side event goes into the join state in one atomic call (a Lua script in
Redis): any replica can complete a key, replicas scale, and a replica that dies loses nothing
(its batch is consumed again; an event that emitted joined events re-emits the same ones, with
the same ids, which the sink's dedupe drops if they were delivered; under ``exactly_once`` the
first attempt's outputs were in its aborted transaction, never visible: the argument is in
docs/concepts/delivery.md). A :class:`JoinSweeper`
(run next to each replica's sources) takes windows that closed: outer joins emit what is
present, inner joins drop them (counted), windows evicted by ``max_pending`` go to the
dead-letter sink. A join on event time under ``exactly_once`` (mode inner or outer, any
``emit``; processing time and mode latest are refused there) closes its windows in the
batches instead (:mod:`._join_close`): the sweeper then only dead-letters evictions.

``emit`` chooses the combinations: ``every`` (each combination of a key's events within the
window, once, :mod:`._join_pairs`), ``latest`` (each event with the latest of every other side)
or ``first`` (one joined event per key and window, :mod:`._join_state`). An event that matches
no side passes through unchanged. No event vanishes without a count: every event that emits
nothing is counted per reason in :meth:`JoinStep.stats` (``absorbed_*``), and late, evicted
and over-``max_key_bytes`` events go to the dead-letter sink with the reason.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from eventbus import cel
from eventbus._internal import keys
from eventbus.eventing._codecs import event_to_json
from eventbus.eventing._event import CloudEvent
from eventbus.pipelines._activation import activation_builder, check_identifiers
from eventbus.pipelines._step import Step, StepContext, Timer
from eventbus.pipelines.steps._join_close import CLOSE_BYTES, CLOSE_LIMIT, REPLAY_S
from eventbus.pipelines.steps._join_config import JoinConfig, exactly_once_refusal
from eventbus.pipelines.steps._join_memory import MemoryJoinState, MemoryPairState
from eventbus.pipelines.steps._join_output import (
    REASONS,
    EventTimeAheadError,
    JoinKeyFullError,
    JoinOutput,
    LateEventError,
    ahead_error,
    event_ms,
    key_full_error,
    late_error,
)
from eventbus.pipelines.steps._join_pairs import PairState, RedisPairState
from eventbus.pipelines.steps._join_state import (
    AFTER_MATCH,
    SUPERSEDED,
    WAITING,
    Item,
    JoinState,
    RedisJoinState,
    now_ms,
)
from eventbus.pipelines.steps._join_sweep import JoinSweeper, closed_outputs, first_output
from eventbus.pipelines.steps._join_watermark import NO_LANE, PROCESSING, Clock
from eventbus.registry import steps

__all__ = ["EventTimeAheadError", "JoinKeyFullError", "JoinStep", "LateEventError"]


class JoinStep(Step):
    """The runtime of a ``join`` step (see the module docstring).

    Args:
        step_id: the step id.
        spec: the join configuration.
        pipeline: the pipeline name (state key prefix, default output source).
        redis_url: the state store; None keeps state in memory (pipeline tests).
        exactly_once: ``delivery.guarantee`` is ``exactly_once``: with event time and emit
            every/latest the batches close the windows (:mod:`._join_close`), not the sweeper.
    """

    kind = "join"
    output: Callable[..., CloudEvent]
    drop_reason = "absorbed"  # an event waiting for its partner emitted nothing yet
    late_errors = frozenset({"LateEventError"})

    def __init__(
        self,
        step_id: str,
        spec: JoinConfig,
        *,
        pipeline: str,
        redis_url: str | None = None,
        exactly_once: bool = False,
    ) -> None:
        super().__init__(step_id)
        self.spec = spec
        self.pipeline = pipeline
        prefix = keys.join_prefix(pipeline, step_id)
        self.state: JoinState = (
            RedisJoinState(redis_url, prefix) if redis_url else MemoryJoinState()
        )
        #: emit every/latest: the windows of all their events
        self.pairs: PairState = (
            RedisPairState(redis_url, prefix) if redis_url else MemoryPairState()
        )
        #: a join under exactly_once (Redis state, event time, mode inner/outer): the batches
        #: close the windows (an outer join emits the incomplete ones) and keep their events
        #: for REPLAY_S, so that one consumed again pairs as the first time; the sweeper only
        #: dead-letters evictions. ``emit: first`` then keeps its windows as every/latest do
        #: (:func:`._join_sweep.first_output`), so that they close the same way.
        self.closing = bool(
            exactly_once and redis_url and spec.time == "event" and spec.mode != "latest"
        )
        self.stream = spec.mode != "latest" and (spec.emit != "first" or self.closing)
        self._sides = []
        used: frozenset[str] = frozenset()
        for side in spec.sides:
            when, key = self._compile(side.when), self._compile(side.key)
            used |= when.variables | key.variables
            self._sides.append((side.name, when.evaluate, key.evaluate))
        self._build = activation_builder(used)
        self.side_names = [s.name for s in spec.sides]
        #: the joined event of a key's sides (see :meth:`JoinOutput.event`)
        self.output = JoinOutput(step_id, spec, pipeline).event
        self._window_ms = int(spec.window_s * 1000)
        self.clock = (
            Clock(True, int(spec.allowed_lateness_s * 1000), int(spec.watermark_idle_s * 1000))
            if spec.time == "event"
            else PROCESSING
        )
        self._ahead_ms = int(spec.max_ahead_s * 1000)
        self.counters = {"joined": 0, "timed_out": 0} | {f"absorbed_{r}": 0 for r in REASONS}

    @staticmethod
    def _compile(source: str) -> cel.Program:
        program = cel.compile(source)
        check_identifiers(program)
        return program

    @staticmethod
    def now() -> int:
        """The step's clock, wall-clock milliseconds (tests move it)."""
        return now_ms()

    def absorb(self, reason: str, n: int = 1) -> None:
        """Count ``n`` events that emitted nothing, for ``reason`` (one of :data:`REASONS`)."""
        self.counters[f"absorbed_{reason}"] += n

    def uses_origins(self) -> bool:
        """``time: event``: the watermark is kept per source partition."""
        return self.clock.event

    def process(self, events: list[CloudEvent]) -> list[Any]:
        """One result per event: the joined event(s), [] while waiting, the event itself when
        it matches no side, or a failure (key error, late event, key full).

        Raises:
            StateUnavailableError: the state store does not answer (the batch is retried).
        """
        return self.process_from(events, None)

    def process_from(self, events: list[CloudEvent], origins: list[str] | None) -> list[Any]:
        """:meth:`process` with each event's source partition (``<topic>[<partition>]``), the
        lane of the event-time watermark it moves (None: all in one lane)."""
        results: list[Any] = [None] * len(events)
        items: list[Item] = []
        where: list[int] = []
        now = self.now()
        event_time = self.clock.event
        for i, e in enumerate(events):
            try:
                act = self._build(e)
                side = next((name for name, when, _ in self._sides if when(act) is True), None)
                if side is None:
                    results[i] = e
                    continue
                key = next(k for name, _, k in self._sides if name == side)(act)
                if not isinstance(key, (str, int)) or isinstance(key, bool):
                    msg = f"join key of side {side!r} is {key!r} ({type(key).__name__}); a key must be a string or an integer"
                    raise TypeError(msg)
                t = event_ms(e) if event_time else now
                if t > now + self._ahead_ms:
                    raise self._ahead(str(key), t, now)
                payload = event_to_json(e)
                if len(payload) > self.spec.max_key_bytes:
                    raise self._full(str(key), len(payload), 0)
                lane = origins[i] if origins is not None else NO_LANE
                items.append((str(key), side, payload, str(e.attributes["id"]), t, lane))
                where.append(i)
            except (cel.CELError, ValueError, TypeError) as exc:
                results[i] = self._failure(exc)
        if not items:
            return results
        if self.spec.mode == "latest":
            self._latest(events, results, items, where, now)
        elif self.stream:
            self._combinations(now, results, items, where)
        else:
            self._first(now, results, items, where)
        return results

    def _full(self, key: str, size: int, held: int) -> JoinKeyFullError:
        self.absorb("key_full")
        return key_full_error(self.spec, key, size, held)

    def _ahead(self, key: str, t: int, now: int) -> EventTimeAheadError:
        self.absorb("ahead")
        return ahead_error(self.spec, key, t, now)

    def _late(self, key: str, t: int, watermark: int) -> LateEventError:
        self.absorb("late")
        return late_error(self.spec, key, t, watermark)

    def _first(
        self,
        now: int,
        results: list[Any],
        items: list[Item],
        where: list[int],
    ) -> None:
        states = self.state.join(
            now, self._window_ms, len(self._sides), self.spec.max_pending, items, self.clock
        )
        for i, (key, _, _, _, t, _), h in zip(where, items, states):
            if not isinstance(h, dict) and h < 0:
                results[i] = self._failure(self._late(key, t, -h))
                continue
            if isinstance(h, dict):
                self.counters["joined"] += 1
                results[i] = [self.output(key, h, now)]
                continue
            results[i] = []
            if h == WAITING:
                self.absorb("waiting")
            elif h == SUPERSEDED:  # the side's earlier event is replaced: it will never join
                self.absorb("superseded")
            elif h == AFTER_MATCH:
                self.absorb("after_match")
            # EVICTED: kept with its key's other events for the dead-letter sink (the sweeper)

    def _combinations(
        self,
        now: int,
        results: list[Any],
        items: list[Item],
        where: list[int],
    ) -> None:
        args = (now, self._window_ms, self.spec.max_pending, self.spec.max_key_bytes, items)
        closed: list[list[tuple[str, dict[str, bytes]]]] = [[] for _ in items]
        if self.closing:
            assert isinstance(self.pairs, RedisPairState)
            added, closed = self.pairs.add_closing(
                *args, self.clock, (CLOSE_LIMIT, CLOSE_BYTES, int(REPLAY_S * 1000))
            )
        else:
            added = self.pairs.add(*args, self.clock)
        latest, first = self.spec.emit == "latest", self.spec.emit == "first"
        for i, (key, side, payload, eid, t, _), (code, t0, same, others), shut in zip(
            where, items, added, closed
        ):
            if code == -3:
                results[i] = self._failure(self._late(key, t, int(t0)))
                continue
            if code == -2:
                results[i] = self._failure(self._full(key, len(payload), same))
                continue
            # exactly_once: the incomplete windows this event closed (or closed the first time)
            results[i] = closed_outputs(self, shut, now)
            if code == -1:
                continue  # its window was evicted: dead-lettered by the sweeper
            if first:
                results[i] = (
                    first_output(self, key, (side, payload), t0, same, others, now) + results[i]
                )
                continue
            if latest and same and code == 1:
                self.absorb("superseded")
            by_side: dict[str, list[tuple[str, int, bytes]]] = {}
            for other in sorted(others, key=lambda o: o[1]):  # by arrival
                by_side.setdefault(other[0].partition("/")[0], []).append(other)
            lists = [
                [(f"{side}/{eid}", 0, payload)] if n == side else by_side.get(n, [])
                for n in self.side_names
            ]
            if latest:
                lists = [[max(lst, key=lambda o: o[1])] if lst else [] for lst in lists]
            outputs = [
                self.output(
                    key,
                    {f.partition("/")[0]: p for f, _, p in combo},
                    now,
                    basis=f"{t0}\x00" + "\x00".join(f for f, _, _ in combo),
                )
                for combo in itertools.product(*lists)
            ]
            if not outputs:
                self.absorb("waiting")
            self.counters["joined"] += len(outputs)
            results[i] = outputs + results[i]

    def _latest(
        self,
        events: list[CloudEvent],
        results: list[Any],
        items: list[Item],
        where: list[int],
        now: int,
    ) -> None:
        table = self.spec.table
        assert table is not None
        found = self.state.latest(self._window_ms, table, items, now, self.clock)
        for i, (key, side, _, _, te, _), t in zip(where, items, found):
            if isinstance(t, int):
                results[i] = self._failure(self._late(key, te, -t))
                continue
            if side == table:
                results[i] = []
                continue
            h: dict[str, bytes] = {side: event_to_json(events[i])}
            if t is not None:
                h[table] = t
            out = self.output(key, h, now, id_of=events[i].attributes["id"])
            results[i] = [out]

    def stats(self) -> dict[str, Any]:
        pending = self.pairs.pending() if self.stream else self.state.pending()
        return {**self.counters, "pending_keys": pending}

    def timers(self) -> list[Timer]:
        """The sweeper that closes this step's windows."""
        return [JoinSweeper(self)]

    def flush(self) -> list[CloudEvent]:
        """End of input (``eventbus test``'s case, ``run_pipeline``): close every open window
        as its timer would (outer joins emit what is present; inner joins count what waited
        as ``absorbed_expired``) and return the outputs; the watermark starts afresh, so the
        next input is not late by this one."""
        sweeper = JoinSweeper(self)
        outputs: list[CloudEvent] = []
        for _ in range(10_000):  # bounded: each pass forgets what it claimed
            out, _dead, claimed = sweeper.sweep(at_end=True)
            if not claimed:
                break
            outputs += out
            sweeper.forget(claimed)
        for state in (self.state, self.pairs):
            if hasattr(state, "watermark"):  # the in-memory states' (pipeline tests)
                state.watermark = None
        return outputs


def _expressions(raw: Any) -> list[tuple[tuple[int | str, ...], str, bool]]:
    out: list[tuple[tuple[int | str, ...], str, bool]] = []
    if isinstance(raw, dict) and isinstance(raw.get("sides"), list):
        for k, side in enumerate(raw["sides"]):
            if isinstance(side, dict):
                for field in ("when", "key"):
                    if isinstance(side.get(field), str) and side[field]:
                        out.append((("sides", k, field), side[field], False))
    return out


@steps.register(
    "join",
    config=JoinConfig,
    description="Correlate events of several sides by key (state in Redis).",
    expressions=_expressions,
    timers=True,
    # emit first/latest and the watermark depend on the order of a partition's events
    ordered=True,
    # delivery.guarantee exactly_once: time event, mode inner or outer (the config's reason)
    exactly_once=exactly_once_refusal,
    example={
        "sides": [
            {"name": "order", "when": "type == 'order'", "key": "data.id"},
            {"name": "payment", "when": "type == 'payment'", "key": "data.id"},
        ],
        "window_s": 60,
    },
)
def build_join(step_id: str, config: JoinConfig, context: StepContext) -> JoinStep:
    """A join step (state in Redis on the platform, in memory in process)."""
    return JoinStep(
        step_id,
        config,
        pipeline=context.pipeline,
        redis_url=context.redis_url,
        exactly_once=context.exactly_once,
    )
