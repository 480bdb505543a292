"""Eventing: the CloudEvent model and codecs, sources and sinks, per-event outcomes."""

from __future__ import annotations

from eventbus.eventing._codecs import (
    decode_kafka,
    encode_kafka_binary,
    encode_kafka_structured,
    event_from_json,
    event_to_json,
    events_from_json_batch,
)
from eventbus.eventing._event import CloudEvent, format_time, is_json_content_type, parse_time
from eventbus.eventing._kafka_client import KafkaClientConfig, KafkaSaslConfig, SecretRef
from eventbus.eventing._outcome import Dispatch, Failure, Outcome
from eventbus.eventing.sinks import KafkaSink, KafkaSinkConfig, Sink
from eventbus.eventing.sources import KafkaSource, KafkaSourceConfig, Source

__all__ = [
    "CloudEvent",
    "Dispatch",
    "Failure",
    "KafkaClientConfig",
    "KafkaSaslConfig",
    "KafkaSink",
    "KafkaSinkConfig",
    "KafkaSource",
    "KafkaSourceConfig",
    "Outcome",
    "SecretRef",
    "Sink",
    "Source",
    "decode_kafka",
    "encode_kafka_binary",
    "encode_kafka_structured",
    "event_from_json",
    "event_to_json",
    "events_from_json_batch",
    "format_time",
    "is_json_content_type",
    "parse_time",
]
