"""Configuration of the schedule source (``sources: [{schedule: {...}}]``).

A schedule emits one event per tick, a cron expression's fire times or a fixed rate, with a
fixed payload and the tick time as the event's ``time``. The pipeline's replicas run the
schedule; one of them at a time (a lease in Redis) writes each tick to the pipeline's ingress
topic (``eventbus-ingress-<pipeline>``, as the gateway writes HTTP events) and then records it
as emitted, so a tick is emitted once across replicas and restarts. See ``_schedule``.
"""

from __future__ import annotations

import json
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from eventbus.eventing._cron import Cron, CronError
from eventbus.eventing.sources._http_config import ingress_topic
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.registry import sources

__all__ = ["MAX_DATA_BYTES", "ScheduleSourceConfig"]

#: Largest fixed payload, as JSON (the ingress record stays well under the broker's 1 MiB).
MAX_DATA_BYTES = 256 * 1024
#: Shortest rate: every tick costs a Redis round trip and a produce.
MIN_EVERY_S = 1.0


class ScheduleSourceConfig(BaseModel):
    """A schedule: one event per tick of ``cron`` or ``every_s`` (give exactly one).

    Example:
        >>> ScheduleSourceConfig(name="nightly", cron="0 2 * * *", data={"job": "report"}).cron
        '0 2 * * *'
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(
        default="schedule",
        pattern=r"^[a-z][a-z0-9_]{0,47}$",
        description="Names the schedule's state in Redis (which ticks were emitted) and its "
        "default CloudEvent source; unique among the pipeline's schedules. Renaming starts afresh.",
    )
    cron: str | None = Field(
        default=None,
        max_length=200,
        description="Cron expression (minute hour day-of-month month day-of-week, or @hourly, "
        "@daily...), in `timezone`.",
    )
    every_s: float | None = Field(
        default=None,
        ge=MIN_EVERY_S,
        le=366 * 86400,
        description="Fixed rate in seconds: ticks at every multiple of it since the Unix epoch "
        "(so every replica agrees on them).",
    )
    timezone: str = Field(default="UTC", description="IANA time zone of `cron` (Europe/Berlin).")
    type: str = Field(
        default="eventbus.schedule", min_length=1, description="CloudEvent type of the ticks."
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        description="CloudEvent source of the ticks (default /eventbus/<pipeline>/schedules/<name>).",
    )
    data: JsonValue = Field(default=None, description="The fixed payload of every tick (JSON).")
    catch_up: Literal["latest", "all", "none"] = Field(
        default="latest",
        description="Ticks missed while no replica ran (older than misfire_grace_s when their "
        "turn came): 'latest' emits the newest of them, 'all' emits them all (the newest "
        "max_catch_up), 'none' emits none. Skipped ticks are counted and logged.",
    )
    max_catch_up: int = Field(
        default=100, ge=1, le=10_000, description="Most missed ticks 'catch_up: all' emits."
    )
    misfire_grace_s: float = Field(
        default=60.0,
        ge=1.0,
        le=86400.0,
        description="A tick emitted at most this late is on time, not missed.",
    )

    @field_validator("cron")
    @classmethod
    def _cron_parses(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Cron.parse(value)
            except CronError as e:
                raise ValueError(str(e)) from None
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            msg = f"unknown time zone {value!r}; use an IANA name such as 'UTC' or 'Europe/Berlin'"
            raise ValueError(msg) from None
        return value

    @field_validator("data")
    @classmethod
    def _small(cls, value: Any) -> Any:
        size = len(json.dumps(value, separators=(",", ":")))
        if size > MAX_DATA_BYTES:
            msg = f"data is {size} bytes as JSON; a schedule's payload may be at most {MAX_DATA_BYTES} (send a reference to larger data)"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _one_timing(self) -> ScheduleSourceConfig:
        if (self.cron is None) == (self.every_s is None):
            msg = "give exactly one of cron (e.g. '*/5 * * * *') or every_s (e.g. 60)"
            raise ValueError(msg)
        if self.every_s is not None and self.timezone != "UTC":
            msg = f"timezone {self.timezone!r} applies to cron only; every_s ticks are zone-free"
            raise ValueError(msg)
        return self

    def event_source(self, pipeline: str) -> str:
        """The CloudEvent ``source`` of the ticks."""
        return self.source or f"/eventbus/{pipeline}/schedules/{self.name}"


def _unique_names(configs: list[ScheduleSourceConfig]) -> None:
    seen: set[str] = set()
    for c in configs:
        if c.name in seen:
            msg = f"two schedule sources are named {c.name!r}; give each schedule its own name"
            raise ValueError(msg)
        seen.add(c.name)


def _describe(raw: dict[str, Any]) -> str:
    if raw.get("cron"):
        return str(raw["cron"])
    return f"every {raw.get('every_s')} s" if raw.get("every_s") else ""


@sources.register(
    "schedule",
    config=ScheduleSourceConfig,
    description="Emit an event per cron or fixed-rate tick (into the pipeline's ingress topic).",
    ingress=True,
    check_all=_unique_names,
    describe=_describe,
    needs_replicas=True,
)
def schedule_source(config: ScheduleSourceConfig, pipeline: str) -> KafkaSourceConfig:
    """The replicas write the ticks to the pipeline's ingress topic and consume it."""
    return KafkaSourceConfig(topic=ingress_topic(pipeline))
