"""Configuration of the Kafka source (``sources: [{kafka: {...}}]`` in pipeline YAML)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from eventbus.eventing._kafka_client import KafkaClientConfig

__all__ = ["KafkaSourceConfig"]


class KafkaSourceConfig(BaseModel):
    """Configuration of a Kafka source (``sources: [{kafka: {...}}]`` in pipeline YAML)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str | list[str] = Field(
        description="The topic to consume, or a list of topics.",
    )
    group: str | None = Field(
        default=None,
        description="Consumer group id; None uses 'eventbus-{pipeline}'. Sources sharing a "
        "group split the partitions between them.",
    )
    bootstrap_servers: str | None = Field(
        default=None,
        description="Comma-separated host:port list of the Kafka cluster; None uses the "
        "runtime's default broker.",
    )
    client: KafkaClientConfig | None = Field(
        default=None,
        description="Connection settings (security_protocol, TLS files, SASL) for this "
        "component's cluster; replaces the stack's (eventbus up --kafka-config) as a whole. "
        "None uses the stack's.",
    )
    start_from: Literal["earliest", "latest"] = Field(
        default="earliest",
        description="Where a group without committed offsets starts: the oldest retained "
        "record or only new ones.",
    )
    type: str = Field(
        default="eventbus.message",
        min_length=1,
        description="CloudEvents 'type' given to plain (non-CloudEvent) messages.",
    )
    source: str | None = Field(
        default=None,
        description="CloudEvents 'source' given to plain messages; None uses 'kafka://{topic}'.",
    )
    fetch_max_wait_ms: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="Longest a fetch waits for data. Low values bound latency at low load "
        "(a broker that does not wake waiting fetches early, like Tansu, otherwise adds up to "
        "this much); each idle partition costs one fetch per interval.",
    )
    idle_fetch_max_wait_ms: int = Field(
        default=500,
        ge=1,
        le=30_000,
        description="Longest a fetch waits for data once the source got no record for 2 s (a long "
        "poll: an idle source then costs one fetch per interval instead of one per "
        "fetch_max_wait_ms); the first records switch back to fetch_max_wait_ms. On a broker "
        "that holds waiting fetches for the whole wait (Tansu) the first event after idleness "
        "waits up to this much.",
    )
    offset_gap_wait_ms: int | None = Field(
        default=None,
        ge=0,
        le=60_000,
        description="How long a gap in a partition's offsets is waited for before it is passed. "
        "Unset: decided by the broker. Apache Kafka (and every broker that assigns offsets as it "
        "appends) leaves real gaps (transaction markers, aborted transactions' records, "
        "compaction): they are passed at once. Tansu (the embedded default's broker, known by its "
        "cluster id) reserves a batch's offsets before it stores the batch, so while two "
        "producers write one partition a later batch can be fetched before an earlier one "
        "exists: there the source fetches again from the gap for up to 1 s until it fills.",
    )

    @model_validator(mode="after")
    def _idle_wait_not_shorter(self) -> KafkaSourceConfig:
        if self.idle_fetch_max_wait_ms < self.fetch_max_wait_ms:
            msg = (
                f"idle_fetch_max_wait_ms ({self.idle_fetch_max_wait_ms}) is shorter than "
                f"fetch_max_wait_ms ({self.fetch_max_wait_ms}); make it at least as long"
            )
            raise ValueError(msg)
        return self

    @field_validator("topic")
    @classmethod
    def _topics_named(cls, value: str | list[str]) -> str | list[str]:
        names = [value] if isinstance(value, str) else value
        if not names or not all(names):
            msg = f"topic is {value!r}; name a topic, or a non-empty list of topic names"
            raise ValueError(msg)
        return value

    @property
    def topics(self) -> list[str]:
        """The topics, always as a list."""
        return [self.topic] if isinstance(self.topic, str) else list(self.topic)
