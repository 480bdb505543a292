"""Sources: where events come from (Kafka; HTTP and gRPC later)."""

from __future__ import annotations

from eventbus.eventing.sources._base import Source
from eventbus.eventing.sources._kafka import DECODE_ERROR_TYPE, KafkaSource, KafkaSourceConfig

__all__ = ["DECODE_ERROR_TYPE", "KafkaSource", "KafkaSourceConfig", "Source"]
