"""The ``spec.delivery`` settings of a pipeline: retries, backoff, dedupe, the guarantee."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

__all__ = ["COMMIT_INTERVAL_MS", "BackoffConfig", "DedupeConfig", "DeliveryConfig"]

#: exactly_once: the default commit interval (Kafka Streams' ``commit.interval.ms`` under
#: exactly_once); its largest value stays well under the time a transaction may take.
COMMIT_INTERVAL_MS = 100
_MAX_COMMIT_INTERVAL_MS = 10_000

_MODEL = ConfigDict(extra="forbid", frozen=True)


class BackoffConfig(BaseModel):
    """Exponential backoff between retries (of events, dispatches and sink sends), jittered."""

    model_config = _MODEL
    initial_ms: PositiveInt = Field(default=100, description="First delay (its upper bound).")
    max_ms: PositiveInt = Field(default=5000, description="Largest delay.")
    jitter: Annotated[float, Field(ge=0, le=1)] = Field(
        default=1.0,
        description="Fraction of each delay drawn at random (1: full jitter, anywhere up to "
        "the delay; 0.2: 80-100% of it; 0: none), so sources that failed together do not "
        "retry together.",
    )


class DedupeConfig(BaseModel):
    """Effectively-once at the sink: outputs already delivered are not sent again."""

    model_config = _MODEL
    window_s: Annotated[float, Field(gt=0, le=7 * 86400)] = Field(
        default=600,
        description="How long a delivered event (CloudEvent source + id) is remembered in Redis. "
        "Memory: about 90 bytes per event in the window.",
    )


class DeliveryConfig(BaseModel):
    """Retries of a failing event before it is dead-lettered; dedupe at the sink."""

    model_config = _MODEL
    retries: Annotated[int, Field(ge=0, le=100)] = Field(
        default=0,
        description="Retries per event that fails in a step (a step's own 'retries' overrides "
        "it). The event is dispatched again alone, after the backoff; its batch-mates are "
        "delivered meanwhile.",
    )
    backoff: BackoffConfig = Field(
        default_factory=BackoffConfig, description="Delay between retries."
    )
    max_age_s: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Stop retrying an event this long after its first failure (then dead-letter it).",
    )
    dedupe: DedupeConfig | None = Field(
        default=None,
        description="Suppress outputs already delivered (by source + id) within a window, in Redis.",
    )
    guarantee: Literal["at_least_once", "exactly_once"] = Field(
        default="at_least_once",
        description="'at_least_once' (with dedupe: effectively once at the sink), or "
        "'exactly_once': each batch's outputs, dead letters and source offsets in one Kafka "
        "transaction (Kafka sources and sinks of one cluster; stateless steps, joins and event-time "
        "aggregates, not those a timer emits for; readers of the sink use "
        "isolation.level=read_committed). No Redis needed without a join.",
    )
    commit_interval_ms: Annotated[int, Field(ge=0, le=_MAX_COMMIT_INTERVAL_MS)] | None = Field(
        default=None,
        description="exactly_once only: how long a partition's transaction stays open for its "
        f"next batches before it commits (default {COMMIT_INTERVAL_MS}; 0: a transaction per "
        f"batch; at most {_MAX_COMMIT_INTERVAL_MS}). It also commits when no next batch is "
        "ready and on a rebalance or stop. Longer: fewer commits, more throughput, outputs "
        "visible to read_committed readers up to this much later.",
    )

    @field_validator("commit_interval_ms", mode="before")
    @classmethod
    def _interval_in_range(cls, v: object) -> object:
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MAX_COMMIT_INTERVAL_MS:
            msg = (
                f"delivery.commit_interval_ms is {v!r}: it must be a whole number of "
                f"milliseconds from 0 (a transaction per batch) to {_MAX_COMMIT_INTERVAL_MS}, "
                f"e.g. {COMMIT_INTERVAL_MS} (the default)"
            )
            raise ValueError(msg)
        return v

    @model_validator(mode="after")
    def _interval_needs_transactions(self) -> DeliveryConfig:
        if self.commit_interval_ms is not None and self.guarantee != "exactly_once":
            msg = (
                f"delivery.commit_interval_ms is {self.commit_interval_ms} but "
                f"delivery.guarantee is {self.guarantee!r}: the interval is that of Kafka "
                "transactions; set guarantee: exactly_once, or drop commit_interval_ms"
            )
            raise ValueError(msg)
        return self

    def commit_interval(self) -> int:
        """The commit interval in milliseconds (exactly_once)."""
        return COMMIT_INTERVAL_MS if self.commit_interval_ms is None else self.commit_interval_ms
