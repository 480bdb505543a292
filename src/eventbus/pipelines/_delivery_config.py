"""The ``spec.delivery`` settings of a pipeline: retries, backoff, dedupe, the guarantee."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

__all__ = ["BackoffConfig", "DedupeConfig", "DeliveryConfig"]

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
        "transaction (Kafka sources and sinks of one cluster, stateless steps; readers of the "
        "sink use isolation.level=read_committed). No Redis needed.",
    )
