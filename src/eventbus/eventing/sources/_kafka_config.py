"""Configuration of the Kafka source (``sources: [{kafka: {...}}]`` in pipeline YAML)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from eventbus.eventing._confluent_avro import SchemaRegistryUrl
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing._topics import TopicCreateConfig, topic_name_problem

__all__ = [
    "MAX_SESSION_TIMEOUT_MS",
    "MIN_HEARTBEAT_INTERVAL_MS",
    "MIN_SESSION_TIMEOUT_MS",
    "KafkaSourceConfig",
]

#: Apache Kafka's broker defaults ``group.min.session.timeout.ms`` and
#: ``group.max.session.timeout.ms``: a member asking a session outside them is refused at its
#: join (``INVALID_SESSION_TIMEOUT``).
MIN_SESSION_TIMEOUT_MS = 6_000
MAX_SESSION_TIMEOUT_MS = 1_800_000
#: Heartbeats more often than this only load the group coordinator.
MIN_HEARTBEAT_INTERVAL_MS = 100


class KafkaSourceConfig(BaseModel):
    """Configuration of a Kafka source (``sources: [{kafka: {...}}]`` in pipeline YAML)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str | list[str] = Field(
        description="The topic to consume, or a list of topics.",
    )
    create: TopicCreateConfig | None = Field(
        default=None,
        description="Create the topic(s) at deploy when missing ({partitions: N}); unset, a "
        "missing topic is refused at deploy (naming it and the closest existing topic).",
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
    value_format: Literal["json", "avro", "json_schema"] = Field(
        default="json",
        description="How record values are encoded. json: CloudEvents in the Kafka binding, or "
        "plain JSON wrapped into an event (as ever). avro: the Confluent wire format (a zero "
        "byte, the 4-byte schema id, the Avro body), its writer schema read from "
        "schema_registry_url; the datum becomes the event's data (bytes as base64). Records "
        "that cannot be decoded (another magic byte, an id the registry does not know, a "
        "truncated body) are dead-lettered with the reason. json_schema: the same header, "
        "then a JSON document validated against the JSON Schema of that id; a document that "
        "does not fit is dead-lettered naming its JSON path and the failed rule. While the "
        "registry cannot be reached the records wait (they are not dead-lettered for an outage).",
    )
    schema_registry_url: SchemaRegistryUrl = None
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

    session_timeout_ms: int = Field(
        default=10_000,
        ge=MIN_SESSION_TIMEOUT_MS,
        le=MAX_SESSION_TIMEOUT_MS,
        description="The consumer-group session timeout: a member that sends no heartbeat for "
        "this long is expelled and its partitions go to the others (a replica that died is "
        "noticed after it). Also how long a rebalance waits for the batches in flight of the "
        "partitions being revoked. Apache Kafka brokers accept 6000 to 1800000 by default "
        "(group.min/max.session.timeout.ms). Tansu holds a group's first join for half of it.",
    )
    heartbeat_interval_ms: int = Field(
        default=3_000,
        ge=MIN_HEARTBEAT_INTERVAL_MS,
        description="How often the consumer heartbeats to its group coordinator; at most half "
        "of session_timeout_ms (Kafka advises a third). A rebalance is noticed at the next "
        "heartbeat.",
    )

    @field_validator("session_timeout_ms", mode="before")
    @classmethod
    def _session_in_brokers_range(cls, value: object) -> object:
        # before pydantic's own bound check: this message names the broker setting and the fix
        if isinstance(value, int) and not (
            MIN_SESSION_TIMEOUT_MS <= value <= MAX_SESSION_TIMEOUT_MS
        ):
            msg = (
                f"session_timeout_ms is {value}; Apache Kafka brokers refuse a consumer-group "
                f"session outside {MIN_SESSION_TIMEOUT_MS}..{MAX_SESSION_TIMEOUT_MS} ms "
                "(group.min.session.timeout.ms / group.max.session.timeout.ms); set it within "
                "that range (the default, 10000, is Kafka's own)"
            )
            raise ValueError(msg)
        return value

    @field_validator("heartbeat_interval_ms", mode="before")
    @classmethod
    def _heartbeat_not_too_often(cls, value: object) -> object:
        if isinstance(value, int) and value < MIN_HEARTBEAT_INTERVAL_MS:
            msg = (
                f"heartbeat_interval_ms is {value}; heartbeats more often than every "
                f"{MIN_HEARTBEAT_INTERVAL_MS} ms only load the group coordinator: set it to at "
                f"least {MIN_HEARTBEAT_INTERVAL_MS} (the default, 3000, is Kafka's own)"
            )
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _heartbeats_within_the_session(self) -> KafkaSourceConfig:
        hb, session = self.heartbeat_interval_ms, self.session_timeout_ms
        if 2 * hb > session:
            msg = (
                f"heartbeat_interval_ms ({hb}) is more than half of session_timeout_ms "
                f"({session}): one late heartbeat would expire the member's session; set "
                f"heartbeat_interval_ms to at most {session // 2} (Kafka advises a third, "
                f"{session // 3}) or raise session_timeout_ms"
            )
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _idle_wait_not_shorter(self) -> KafkaSourceConfig:
        if self.idle_fetch_max_wait_ms < self.fetch_max_wait_ms:
            msg = (
                f"idle_fetch_max_wait_ms ({self.idle_fetch_max_wait_ms}) is shorter than "
                f"fetch_max_wait_ms ({self.fetch_max_wait_ms}); make it at least as long"
            )
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _avro_has_a_registry(self) -> KafkaSourceConfig:
        if self.value_format != "json" and not self.schema_registry_url:
            msg = (
                f"value_format is {self.value_format!r} but schema_registry_url is not set; set it to the "
                "registry the producers use (EventBus's own: `eventbus url registry`)"
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
        problems = [p for p in map(topic_name_problem, names) if p]
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @property
    def topics(self) -> list[str]:
        """The topics, always as a list."""
        return [self.topic] if isinstance(self.topic, str) else list(self.topic)
