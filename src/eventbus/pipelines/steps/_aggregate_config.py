"""Configuration of the ``aggregate`` step (``steps: [{id: ..., aggregate: {...}}]``).

An aggregation is written as ``count``, ``{OP: CEL}`` (``sum``, ``min``, ``max``, ``avg``,
``first``, ``last``, ``distinct``), ``{collect: CEL, max: N}`` or a CEL reducer
``{init: CEL, add: CEL, merge: CEL}``; the shape picks the model (a callable discriminator),
so a mistake is reported against the one shape it resembles.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    field_validator,
    model_validator,
)

from eventbus.pipelines.steps._values import CONFIG, CelSource

__all__ = [
    "FIELD_OPS",
    "AggregateConfig",
    "AggregateOutputConfig",
    "Aggregation",
    "CollectAggregation",
    "FieldAggregation",
    "ReducerAggregation",
    "WindowConfig",
]

#: Aggregations over one CEL value per event, written ``{OP: CEL}``.
FIELD_OPS = ("sum", "min", "max", "avg", "first", "last", "distinct")
_RESERVED = ("key", "window_start", "window_end")
_SHAPES = (
    "an aggregation is 'count', {OP: CEL} with OP one of "
    + ", ".join(FIELD_OPS)
    + ", {collect: CEL, max: N} or a reducer {init: CEL, add: CEL, merge: CEL}"
)
Seconds = Annotated[float, Field(gt=0, le=30 * 86400)]


class TumblingConfig(BaseModel):
    """Fixed, non-overlapping windows aligned to the epoch."""

    model_config = CONFIG
    size_s: Seconds = Field(description="Window length in seconds.")


class HoppingConfig(BaseModel):
    """Overlapping windows of ``size_s`` starting every ``advance_s`` (an event is in
    ``size_s / advance_s`` of them)."""

    model_config = CONFIG
    size_s: Seconds = Field(description="Window length in seconds.")
    advance_s: Seconds = Field(description="Seconds between window starts (at most size_s).")

    @model_validator(mode="after")
    def _advance(self) -> HoppingConfig:
        if self.advance_s > self.size_s:
            msg = f"hopping advance_s ({self.advance_s:g}) is larger than size_s ({self.size_s:g}): events between windows would be lost; make advance_s <= size_s (or use tumbling)"
            raise ValueError(msg)
        if self.size_s / self.advance_s > 1000:
            msg = f"hopping size_s / advance_s is {self.size_s / self.advance_s:g}: each event would update that many windows; keep it at most 1000"
            raise ValueError(msg)
        return self


class SessionConfig(BaseModel):
    """A key's window stays open while its events come less than ``gap_s`` apart."""

    model_config = CONFIG
    gap_s: Seconds = Field(description="Inactivity (seconds) that ends a key's session.")


class WindowConfig(BaseModel):
    """Exactly one of tumbling, hopping, session."""

    model_config = CONFIG
    tumbling: TumblingConfig | None = Field(default=None, description="Fixed windows.")
    hopping: HoppingConfig | None = Field(default=None, description="Overlapping windows.")
    session: SessionConfig | None = Field(default=None, description="Per-key activity sessions.")

    @model_validator(mode="after")
    def _one(self) -> WindowConfig:
        given = [n for n in ("tumbling", "hopping", "session") if getattr(self, n) is not None]
        if len(given) != 1:
            got = " and ".join(given) if given else "none"
            msg = f"window needs exactly one of tumbling, hopping, session; got {got}, e.g. window: {{tumbling: {{size_s: 60}}}}"
            raise ValueError(msg)
        return self


class FieldAggregation(BaseModel):
    """``{OP: CEL}``: one value per event (null values are skipped)."""

    model_config = CONFIG
    sum: CelSource | None = Field(default=None, description="Sum of the numbers.")
    min: CelSource | None = Field(default=None, description="Smallest number.")
    max: CelSource | None = Field(default=None, description="Largest number.")
    avg: CelSource | None = Field(default=None, description="Mean of the numbers.")
    first: CelSource | None = Field(default=None, description="Value of the earliest event.")
    last: CelSource | None = Field(default=None, description="Value of the latest event.")
    distinct: CelSource | None = Field(
        default=None,
        description="Approximate count of distinct values (Redis HyperLogLog, ~0.8% error; exact in memory).",
    )

    @model_validator(mode="after")
    def _one(self) -> FieldAggregation:
        given = [op for op in FIELD_OPS if getattr(self, op) is not None]
        if len(given) != 1:
            msg = f"give one operation per aggregation; got {', '.join(given)}: split them into separate named aggregations"
            raise ValueError(msg)
        return self

    @property
    def op(self) -> str:
        """The operation's name."""
        return next(op for op in FIELD_OPS if getattr(self, op) is not None)

    @property
    def field(self) -> str:
        """The CEL expression of the value."""
        value = getattr(self, self.op)
        assert isinstance(value, str)
        return value


class CollectAggregation(BaseModel):
    """``{collect: CEL, max: N}``: the values in arrival order, at most ``max``."""

    model_config = CONFIG
    collect: CelSource = Field(description="CEL: the value to collect.")
    max: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=100,
        description="Most values kept per window; more are counted (collect_truncated), not kept.",
    )


class ReducerAggregation(BaseModel):
    """A CEL reducer: ``acc`` starts as ``init``; ``add`` folds each event into it."""

    model_config = CONFIG
    init: CelSource = Field(description="CEL constant: the accumulator's start, e.g. '0'.")
    add: CelSource = Field(
        description="CEL: the next accumulator, from 'acc' and the event's variables, e.g. 'acc + data.amount'."
    )
    merge: CelSource | None = Field(
        default=None,
        description="CEL: two accumulators 'acc' and 'other' combined (e.g. 'acc + other'). With it, each "
        "batch is folded into one partial; without it the window keeps its events (at most max) and folds them when it closes.",
    )
    max: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=10_000,
        description="Without merge: most events kept per window (more are counted, reducer_truncated).",
    )


def _shape(value: Any) -> str | None:
    if value == "count":
        return "count"
    if isinstance(value, dict):
        if "collect" in value:
            return "collect"
        if "init" in value or "add" in value:
            return "reducer"
        if any(op in value for op in FIELD_OPS):
            return "field"
    if isinstance(value, BaseModel):
        return {
            CollectAggregation: "collect",
            ReducerAggregation: "reducer",
            FieldAggregation: "field",
        }.get(type(value))
    return None


Aggregation = Annotated[
    Annotated[Literal["count"], Tag("count")]
    | Annotated[FieldAggregation, Tag("field")]
    | Annotated[CollectAggregation, Tag("collect")]
    | Annotated[ReducerAggregation, Tag("reducer")],
    Discriminator(_shape, custom_error_type="aggregation_shape", custom_error_message=_SHAPES),
]
AggregationName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")]


class AggregateOutputConfig(BaseModel):
    """The event emitted per key and window."""

    model_config = CONFIG
    type: str | None = Field(
        default=None, min_length=1, description="Its type; default '<step id>.window'."
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        description="Its source; default '/eventbus/<pipeline>/<step id>'.",
    )


class AggregateConfig(BaseModel):
    """Aggregate events per key over tumbling, hopping or session windows (state in Redis)."""

    model_config = CONFIG
    key: CelSource = Field(description="CEL: the key of an event, e.g. 'data.user'.")
    window: WindowConfig = Field(
        description="{tumbling: {size_s}}, {hopping: {size_s, advance_s}} or {session: {gap_s}}."
    )
    time: Literal["event", "processing"] = Field(
        default="event",
        description="event: windows by the event's 'time' attribute, closed by the watermark (the latest "
        "event time seen; it also advances with the wall clock once no events came for idle_timeout_s); "
        "processing: by arrival.",
    )
    idle_timeout_s: Annotated[float, Field(ge=0, le=86400)] = Field(
        default=5,
        description="time: event: once no event moved the watermark for this long, the wall "
        "clock moves it on, so the windows of an idle input close. A backlog read slower than "
        "real time keeps moving it, so its windows close by event time only. Not under "
        "delivery.guarantee exactly_once: there only consumed events close windows.",
    )
    allowed_lateness_s: Annotated[float, Field(ge=0, le=7 * 86400)] = Field(
        default=0,
        description="How long after its end (by the watermark) a window still takes events; later "
        "events go to the dead-letter sink (AggregateLateEventError).",
    )
    emit: Literal["close", "update"] = Field(
        default="close",
        description="close: one event per key and window when it closes; update: also one per batch "
        "for each window the batch changed.",
    )
    aggregations: dict[AggregationName, Aggregation] = Field(
        min_length=1,
        max_length=64,
        description="Name -> aggregation: 'count', {sum|min|max|avg|first|last|distinct: CEL}, "
        "{collect: CEL, max: N} or {init: CEL, add: CEL, merge: CEL}.",
    )
    output: AggregateOutputConfig = Field(
        default_factory=AggregateOutputConfig, description="The emitted event."
    )

    @field_validator("aggregations")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if name in _RESERVED:
                msg = f"aggregation name {name!r} is taken by the output's own field ({', '.join(_RESERVED)}); rename it"
                raise ValueError(msg)
        return value
