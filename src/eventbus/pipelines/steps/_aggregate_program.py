"""What an ``aggregate`` step's configuration compiles to: its key and per-aggregation CEL, its
reducers, the state's :class:`~._aggregate_ops.Spec`, the window sizes and the output's
identity. The step (:mod:`._aggregate`), the batch's items (:mod:`._aggregate_items`) and the
window events (:mod:`._aggregate_output`) all read this one object."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eventbus import cel
from eventbus.eventing._event import CloudEvent
from eventbus.pipelines._activation import activation_builder
from eventbus.pipelines.steps._aggregate_config import (
    AggregateConfig,
    CollectAggregation,
    FieldAggregation,
    ReducerAggregation,
)
from eventbus.pipelines.steps._aggregate_ops import Spec
from eventbus.pipelines.steps._values import compile_cel, json_value

__all__ = ["AggregateProgram", "check_value", "compile_aggregate", "value_getters"]

_NUMERIC = ("sum", "avg", "min", "max")


@dataclass(eq=False)
class AggregateProgram:
    """An aggregate step's compiled configuration (built by :func:`compile_aggregate`)."""

    spec: AggregateConfig
    step_id: str
    pipeline: str
    names: list[str]  #: the aggregations' names, in order
    fields: list[Any]  #: per aggregation: its CEL evaluate, or None (count, reducer)
    reducers: dict[int, tuple[Any, Any, Any]]  #: aggregation index -> (init, add, merge)
    key: Callable[[dict[str, Any]], Any]  #: the key's CEL evaluate
    build: Callable[[CloudEvent], dict[str, Any]]  #: an event's CEL activation
    #: expressions of data only, no reducer keeping activations: one dict serves every event
    shared_act: bool
    state_spec: Spec
    size_ms: int  #: a tumbling or hopping window's size (0: session windows)
    advance_ms: int  #: a hopping window's advance (tumbling: the size)
    #: tumbling windows of counts and sums only: the batch folded in one pass
    sums_only: bool
    type: str  #: the window events' type
    source: str  #: the window events' source
    getters: list[Any]  #: per aggregation: its checked value of an activation (see value_getters)


def compile_aggregate(step_id: str, spec: AggregateConfig, pipeline: str) -> AggregateProgram:
    """Compile an aggregate step's configuration.

    Raises:
        cel.CELError: an expression does not compile (naming the aggregation).
    """
    ops: list[str] = []
    maxes: list[int] = []
    fields: list[Any] = []
    reducers: dict[int, tuple[Any, Any, Any]] = {}
    key = compile_cel(spec.key)
    used: frozenset[str] = key.variables
    for a, (name, agg) in enumerate(spec.aggregations.items()):
        program = None
        if isinstance(agg, FieldAggregation):
            ops.append(agg.op)
            program = _compile(name, agg.op, agg.field)
        elif isinstance(agg, CollectAggregation):
            ops.append("collect")
            program = _compile(name, "collect", agg.collect)
        elif isinstance(agg, ReducerAggregation):
            ops.append("reducer")
            reducers[a] = _reducer(name, agg)
            used |= reducers[a][1].variables - {"acc"}
        else:
            ops.append("count")
        maxes.append(agg.max if isinstance(agg, (CollectAggregation, ReducerAggregation)) else 0)
        if program is not None:
            used |= program.variables
        fields.append(program.evaluate if program is not None else None)
    w = spec.window
    size_ms = int(1000 * (w.tumbling or w.hopping).size_s) if not w.session else 0  # type: ignore[union-attr]
    advance_ms = int(1000 * w.hopping.advance_s) if w.hopping else size_ms
    state_spec = Spec(
        ops,
        maxes,
        int(1000 * spec.allowed_lateness_s),
        int(1000 * w.session.gap_s) if w.session else 0,
        update=spec.emit == "update",
        processing=spec.time == "processing",
        idle_ms=int(1000 * spec.idle_timeout_s),
    )
    names = list(spec.aggregations)
    return AggregateProgram(
        spec=spec,
        step_id=step_id,
        pipeline=pipeline,
        names=names,
        fields=fields,
        reducers=reducers,
        key=key.evaluate,
        build=activation_builder(used | frozenset({"data"})),
        shared_act=used <= {"data"} and not reducers,
        state_spec=state_spec,
        size_ms=size_ms,
        advance_ms=advance_ms,
        sums_only=size_ms > 0 and advance_ms == size_ms and set(ops) <= {"count", "sum"},
        type=spec.output.type or f"{step_id}.window",
        source=spec.output.source or f"/eventbus/{pipeline}/{step_id}",
        getters=value_getters(names, ops, fields),
    )


def _compile(name: str, op: str, source: str) -> cel.Program:
    try:
        return compile_cel(source)
    except cel.CELError as exc:
        msg = f"aggregation {name!r} ({op}: {source!r}): {exc}"
        raise cel.CELError(msg) from None


def _reducer(name: str, agg: ReducerAggregation) -> tuple[Any, Any, Any]:
    init = cel.compile(agg.init)
    if init.variables:
        msg = f"aggregation {name!r}: init {agg.init!r} uses {sorted(init.variables)[0]!r}; init is a constant such as '0', '[]' or '{{}}'"
        raise cel.CELError(msg)
    add = _compile(name, "add", agg.add)
    merge = None
    if agg.merge is not None:
        merge = cel.compile(agg.merge)
        extra = sorted(merge.variables - {"acc", "other"})
        if extra:
            msg = f"aggregation {name!r}: merge {agg.merge!r} uses {extra[0]!r}; merge sees only 'acc' and 'other' (two accumulators), e.g. 'acc + other'"
            raise cel.CELError(msg)
    return json_value(init.evaluate({})), add, merge


def check_value(name: str, op: str, v: Any) -> Any:
    """Aggregation ``name``'s value as its expression gave it: checked (numbers for sum, avg,
    min and max) and JSON-ready.

    Raises:
        TypeError: a sum, avg, min or max got something other than a finite number.
    """
    if v is None or op not in _NUMERIC:
        return v if v is None else json_value(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        msg = f"aggregation {name!r} ({op}) needs a finite number; its expression gave {v!r} ({type(v).__name__}): convert it, e.g. double(data.amount)"
        raise TypeError(msg)
    return v


def value_getters(names: list[str], ops: list[str], fields: list[Any]) -> list[Any]:
    """Per aggregation a function of the activation giving its checked value (None: count);
    a string or a finite int or float passes as it is, the rest goes to :func:`check_value`."""
    out: list[Any] = []
    isfinite = math.isfinite
    for name, op, fn in zip(names, ops, fields):
        if fn is None:
            out.append(None)
            continue
        numeric = op in _NUMERIC

        def get(
            act: dict[str, Any],
            name: str = name,
            op: str = op,
            fn: Any = fn,
            numeric: bool = numeric,
        ) -> Any:
            v = fn(act)
            c = v.__class__
            if c is int or (c is float and isfinite(v)) or (c is str and not numeric):
                return v
            return check_value(name, op, v)

        out.append(get)
    return out
