"""The ``join`` step: correlate events of several sides by key within a window.

Per batch, every side event goes into the join state in one atomic call (a Lua script in
Redis): any replica can complete a key, replicas scale, and a replica that dies loses nothing
(its batch is consumed again; the event that completed a key re-emits the same joined event,
with the same id, which the sink's dedupe drops if it was delivered). A :class:`JoinSweeper` (run next to each replica's
sources) takes keys whose window closed: outer joins emit what is present, inner joins drop
them, keys evicted by ``max_pending`` go to the dead-letter sink.

An event matching no side passes through unchanged; an event whose side arrived after its
key completed is part of the next window only once the completed one expires.
"""

from __future__ import annotations

import hashlib
from datetime import UTC
from typing import Any

from eventbus import cel
from eventbus._internal import keys
from eventbus.eventing._codecs import event_from_json, event_to_json
from eventbus.eventing._event import CloudEvent, format_time, parse_time
from eventbus.pipelines._activation import activation_builder, check_identifiers
from eventbus.pipelines._step import Fired, Step, StepContext, Timer
from eventbus.pipelines.steps._join_config import JoinConfig
from eventbus.pipelines.steps._join_state import JoinState, MemoryJoinState, RedisJoinState, now_ms
from eventbus.registry import steps

__all__ = ["JoinStep", "JoinSweeper", "LateEventError"]


class LateEventError(ValueError):
    """An event's time is older than the join window plus the allowed lateness."""


class JoinStep(Step):
    """The runtime of a ``join`` step (see the module docstring).

    Args:
        step_id: the step id.
        spec: the join configuration.
        pipeline: the pipeline name (state key prefix, default output source).
        redis_url: the state store; None keeps state in memory (pipeline tests).
    """

    kind = "join"

    def __init__(
        self, step_id: str, spec: JoinConfig, *, pipeline: str, redis_url: str | None = None
    ) -> None:
        self.id = step_id
        self.errors = 0
        self.spec = spec
        self.pipeline = pipeline
        prefix = keys.join_prefix(pipeline, step_id)
        self.state: JoinState = (
            RedisJoinState(redis_url, prefix) if redis_url else MemoryJoinState()
        )
        self._sides = []
        used: frozenset[str] = frozenset()
        for side in spec.sides:
            when, key = self._compile(side.when), self._compile(side.key)
            used |= when.variables | key.variables
            self._sides.append((side.name, when.evaluate, key.evaluate))
        self._build = activation_builder(used)
        self._names = [s.name for s in spec.sides]
        self._data = None
        if spec.output.data is not None:
            program = cel.compile(spec.output.data)
            unknown = sorted(program.variables - set(self._names))
            if unknown:
                msg = f"join output.data uses {unknown[0]!r}, which is not a side; its variables are the side names ({', '.join(self._names)})"
                raise cel.CELError(msg)
            self._data = program.evaluate
        self.type = spec.output.type or f"{step_id}.joined"
        self.source = spec.output.source or f"/eventbus/{pipeline}/{step_id}"
        self._window_ms = int(spec.window_s * 1000)
        self._late_ms = int((spec.window_s + spec.allowed_lateness_s) * 1000)
        self.counters = {
            "joined": 0,
            "pending_events": 0,
            "late": 0,
            "expired": 0,
            "timed_out": 0,
            "evicted": 0,
        }

    @staticmethod
    def _compile(source: str) -> cel.Program:
        program = cel.compile(source)
        check_identifiers(program)
        return program

    def process(self, events: list[CloudEvent]) -> list[Any]:
        """One result per event: the joined event(s), [] while waiting, the event itself when
        it matches no side, or a failure (key error, late event).

        Raises:
            StateUnavailableError: the state store does not answer (the batch is retried).
        """
        results: list[Any] = [None] * len(events)
        items: list[tuple[str, str, bytes, str]] = []
        where: list[int] = []
        now = now_ms()
        event_time = self.spec.time == "event"
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
                if event_time and "time" in e.attributes:
                    t = int(parse_time(e.attributes["time"]).timestamp() * 1000)
                    if t < now - self._late_ms:
                        self.counters["late"] += 1
                        msg = (
                            f"event time {e.attributes['time']} is {(now - t) / 1000:.1f} s old, beyond the join window "
                            f"({self.spec.window_s:g} s) plus allowed_lateness_s ({self.spec.allowed_lateness_s:g} s)"
                        )
                        raise LateEventError(msg)
                items.append((str(key), side, event_to_json(e), str(e.attributes["id"])))
                where.append(i)
            except (cel.CELError, ValueError, TypeError) as exc:
                results[i] = self._failure(exc)
        if not items:
            return results
        if self.spec.mode == "latest":
            self._latest(events, results, items, where)
            return results
        states = self.state.join(
            now, self._window_ms, len(self._sides), self.spec.max_pending, items
        )
        for i, (key, _, _, _), h in zip(where, items, states):
            if h is None:
                self.counters["pending_events"] += 1
                results[i] = []
            else:
                self.counters["joined"] += 1
                results[i] = [self.output(key, h, now)]
        return results

    def _latest(
        self,
        events: list[CloudEvent],
        results: list[Any],
        items: list[tuple[str, str, bytes, str]],
        where: list[int],
    ) -> None:
        table = self.spec.table
        assert table is not None
        found = self.state.latest(self._window_ms, table, [(k, s, p) for k, s, p, _ in items])
        now = now_ms()
        for i, (key, side, _, _), t in zip(where, items, found):
            if side == table:
                results[i] = []
                continue
            h: dict[str, bytes] = {side: event_to_json(events[i])}
            if t is not None:
                h[table] = t
            out = self.output(key, h, now, id_of=events[i].attributes["id"])
            results[i] = [out]

    def output(
        self, key: str, h: dict[str, bytes], now: int, *, id_of: str | None = None
    ) -> CloudEvent:
        """The joined event of a key's sides (missing sides named in ``_missing``)."""
        present = {n: event_from_json(h[n]) for n in self._names if n in h}
        missing = [n for n in self._names if n not in present]
        if self._data is not None:
            act = {
                n: ({**present[n].attributes, "data": present[n].data} if n in present else None)
                for n in self._names
            }
            from eventbus.pipelines.steps._values import json_value as _json_value

            data = _json_value(self._data(act))
        else:
            data = {n: e.data for n, e in present.items()}
            if missing:
                data["_missing"] = missing
        basis = f"{key}\x00{id_of if id_of is not None else h.get('__t0', b'').decode()}"
        digest = hashlib.blake2b(basis.encode(), digest_size=10).hexdigest()
        attrs: dict[str, Any] = {
            "specversion": "1.0",
            "id": f"{self.id}-{digest}",
            "source": self.source,
            "type": self.type,
            "time": format_time_ms(now),
            "datacontenttype": "application/json",
            "partitionkey": key,
        }
        return CloudEvent(attrs, data)

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "pending_keys": self.state.pending()}

    def timers(self) -> list[Timer]:
        """The sweeper that closes this step's windows."""
        return [JoinSweeper(self)]


def format_time_ms(ms: int) -> str:
    from datetime import datetime

    return format_time(datetime.fromtimestamp(ms / 1000, tz=UTC))


class JoinSweeper(Timer):
    """Closes the windows of a join step: run :meth:`sweep` every second or so.

    Args:
        step: the join step (its state and output format).
        lease_s: how long a claim holds before another sweeper may take the keys over.
    """

    def __init__(self, step: JoinStep, lease_s: float = 30.0) -> None:
        self.step = step
        self._lease_ms = int(lease_s * 1000)

    def sweep(self, limit: int = 5000) -> tuple[list[CloudEvent], list[CloudEvent], list[str]]:
        """Claim keys whose window closed: (outputs for the sink, events for the dead-letter
        sink, keys to :meth:`ack` once both were delivered).

        Raises:
            StateUnavailableError: Redis does not answer.
        """
        step = self.step
        now = now_ms()
        outputs: list[CloudEvent] = []
        dead: list[CloudEvent] = []
        keys: list[str] = []
        for key, h in step.state.claim_due(now, self._lease_ms, limit):
            keys.append(key)
            if not h:
                continue  # expired already
            if "__evicted" in h:
                step.counters["evicted"] += 1
                for n in step._names:
                    if n in h:
                        dead.append(
                            event_from_json(h[n]).replace(
                                ebpipeline=step.pipeline,
                                ebstep=step.id,
                                eberrortype="JoinEvictedError",
                                eberror=f"join key {key!r} evicted: more than max_pending ({step.spec.max_pending}) keys were waiting",
                                ebattempts=1,
                            )
                        )
            elif "__done" in h:
                continue
            elif step.spec.mode == "outer":
                step.counters["timed_out"] += 1
                outputs.append(step.output(key, h, now))
            else:
                step.counters["expired"] += 1
        return outputs, dead, keys

    def fire(self) -> Fired | None:
        """One :meth:`sweep`: the keys are the token."""
        outputs, dead, keys = self.sweep()
        return Fired(outputs, dead, keys) if keys else None

    def ack(self, fired: Fired) -> None:
        """Forget the keys of a delivered sweep."""
        self.forget(fired.token)

    def forget(self, keys: list[str]) -> None:
        """Forget delivered keys."""
        self.step.state.ack(keys)


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
    return JoinStep(step_id, config, pipeline=context.pipeline, redis_url=context.redis_url)
