"""Configuration of the ``join`` step (``steps: [{id: ..., join: {...}}]``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

__all__ = ["JoinConfig", "JoinOutputConfig", "JoinSideConfig", "exactly_once_refusal"]

_MODEL = ConfigDict(extra="forbid", frozen=True)
SideName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")]


class JoinSideConfig(BaseModel):
    """One side of a join: which events belong to it and their join key."""

    model_config = _MODEL
    name: SideName = Field(
        description="The side's name: the key of its data in the joined event, and its CEL variable in output.data."
    )
    when: str = Field(
        min_length=1,
        description="CEL: true for the events of this side, e.g. \"type == 'order.created'\".",
    )
    key: str = Field(
        min_length=1,
        description="CEL: the join key of an event of this side, e.g. 'data.order_id'.",
    )


class JoinOutputConfig(BaseModel):
    """The joined event."""

    model_config = _MODEL
    type: str | None = Field(
        default=None, min_length=1, description="Its type; default '<step id>.joined'."
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        description="Its source; default '/eventbus/<pipeline>/<step id>'.",
    )
    data: str | None = Field(
        default=None,
        min_length=1,
        description="CEL giving its data, with each side's name bound to that side's event (a map of "
        "its attributes and 'data'; null when missing). Default: {side: side's data, ...} plus "
        "'_missing': [names] when sides are missing.",
    )


class JoinConfig(BaseModel):
    """Correlate events of two or more sides by key within a window (state in Redis)."""

    model_config = _MODEL
    mode: Literal["inner", "outer", "latest"] = Field(
        default="inner",
        description="inner: emit when every side is present; outer: also emit what is present when "
        "the window closes, marking the missing sides; latest: enrich each event of the other sides "
        "with the latest event of the 'table' side.",
    )
    emit: Literal["every", "first", "latest"] = Field(
        default="every",
        description="Which combinations of a key's events inner and outer joins emit within a window. "
        "every: every combination, once, when its last event arrives (orders o1, o2 and payments p1, p2 "
        "of one key: o1+p1, o1+p2, o2+p1, o2+p2); latest: each arriving event with the latest event of "
        "every other side; first: one joined event per key and window, when every side is present (the "
        "behaviour before emit: existed; later events of the key are counted as absorbed_after_match).",
    )
    max_key_bytes: Annotated[int, Field(ge=1024, le=512 * 1024 * 1024)] = Field(
        default=1024 * 1024,
        description="Most bytes of events one key keeps in its window (every, latest) or one event may "
        "have (first); an event beyond it goes to the dead-letter sink (JoinKeyFullError).",
    )
    sides: Annotated[list[JoinSideConfig], Field(min_length=2, max_length=16)] = Field(
        description="The sides, at least two."
    )
    window_s: Annotated[float, Field(gt=0, le=7 * 86400)] = Field(
        default=600,
        description="How long a key waits for its other sides, from its first event (latest: how long a table entry lives).",
    )
    time: Literal["processing", "event"] = Field(
        default="processing",
        description="processing: windows by the wall clock (a key's window opens at its first event's "
        "arrival), no event is late. event: windows by the events' CloudEvent time (a key's window "
        "opens at its first event's time) and a watermark per source partition (the smallest latest "
        "event time over the partitions that sent events within watermark_idle_s); a window closes "
        "when the watermark passes its start + window_s + allowed_lateness_s, and an event whose time "
        "+ window_s + allowed_lateness_s is before the watermark is late: counted (absorbed_late) and "
        "dead-lettered (LateEventError).",
    )
    allowed_lateness_s: Annotated[float, Field(ge=0, le=7 * 86400)] = Field(
        default=0,
        description="time: event: how far behind the watermark an event may be and still join "
        "(windows stay open this much longer).",
    )
    max_ahead_s: Annotated[float, Field(gt=0, le=366 * 86400)] = Field(
        default=3600,
        description="time: event: an event whose time is more than this ahead of the wall clock fails "
        "(EventTimeAheadError, dead-lettered, counted absorbed_ahead): one event from a wrong clock "
        "would otherwise move its partition's watermark into the future and make what follows late.",
    )
    watermark_idle_s: Annotated[float, Field(gt=0, le=86400)] = Field(
        default=30,
        description="time: event: a source partition that sent no event for this long stops holding "
        "the watermark back; when all are idle, the watermark moves on with the wall clock (so the "
        "last windows close). Longer than the longest pause of a partition (a replica restart).",
    )
    max_pending: Annotated[int, Field(ge=1, le=100_000_000)] = Field(
        default=1_000_000,
        description="Most keys waiting at once; the oldest beyond it go to the dead-letter sink.",
    )
    table: SideName | None = Field(
        default=None, description="latest mode: the side kept as the lookup table."
    )
    output: JoinOutputConfig = Field(
        default_factory=JoinOutputConfig, description="The joined event."
    )

    @model_validator(mode="after")
    def _consistent(self) -> JoinConfig:
        names = [s.name for s in self.sides]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            msg = f"join side name {dup!r} is used twice; give each side its own name"
            raise ValueError(msg)
        if self.mode == "latest":
            if self.table is None:
                msg = f"join mode 'latest' needs 'table:' naming the side to look up (one of {', '.join(names)})"
                raise ValueError(msg)
            if self.table not in names:
                msg = f"join table {self.table!r} is not a side (sides: {', '.join(names)})"
                raise ValueError(msg)
            if "emit" in self.model_fields_set:
                msg = f"'emit: {self.emit}' is for modes inner and outer; mode 'latest' enriches each event with the table's latest: remove emit"
                raise ValueError(msg)
        elif self.table is not None:
            msg = f"'table:' is for mode 'latest'; mode is {self.mode!r}: remove it or set mode: latest"
            raise ValueError(msg)
        if self.time == "processing":
            for name in ("allowed_lateness_s", "watermark_idle_s", "max_ahead_s"):
                if name in self.model_fields_set:
                    msg = f"'{name}' is for 'time: event'; time is 'processing' (no event is late): remove it or set time: event"
                    raise ValueError(msg)
        return self


def exactly_once_refusal(config: JoinConfig) -> tuple[str, str] | None:
    """Why a join with ``config`` cannot run under ``delivery: {guarantee: exactly_once}``:
    (the setting, the reason and its fix), or None when it can.

    Only ``time: event`` with mode ``inner`` or ``outer`` runs exactly once: every joined
    event is emitted by a consumed event, inside that event's batch's transaction, the
    consumed events close the windows (:mod:`._join_close`, every ``emit``: an outer join
    emits the incomplete ones) and a closed window keeps its events for ``REPLAY_S``, so an
    event consumed again after an aborted transaction emits what it emitted the first time
    (see docs/concepts/delivery.md). By the wall clock the step's timer closes the windows,
    outside every Kafka transaction; ``mode: latest`` reads the table's current entry, which
    the join's Redis state does not roll back with an aborted transaction.
    """
    if config.mode == "latest":
        return (
            "mode 'latest'",
            "an event is enriched with the table's entry present when it is consumed, and "
            "the join's state in Redis is not rolled back with an aborted transaction: an "
            "event consumed again can find the entry replaced by a later table event of its "
            "aborted attempt, or expired (it lives window_s by the wall clock), and be joined "
            "otherwise than in any run without the abort; use mode: inner with time: event "
            "(emit: latest pairs each event with the latest event of every other side in its "
            "window; the consumed events close the windows)",
        )
    if config.time == "event":
        return None
    if config.mode == "outer":
        return (
            "mode 'outer' and time 'processing'",
            "processing-time windows close by the wall clock, from a timer outside any consumed "
            "batch, so no Kafka transaction covers the outputs of the keys left incomplete; use "
            "time: event (windows then close when a consumed event moves the watermark past "
            "them, inside its batch's transaction)",
        )
    return (
        "time 'processing'",
        "processing-time windows are forgotten by the wall clock, from a timer outside any "
        "consumed batch: an event consumed again after an aborted transaction, once its "
        "window was forgotten, opens a new window, and the pairs its aborted attempt emitted "
        "are never emitted again (counted absorbed_expired); use time: event (the consumed "
        "events close the windows inside their batches' transactions and keep a closed "
        "window's events 10 minutes, so an event consumed again pairs as the first time)",
    )
