"""Sinks: where output and dead-letter events go (Kafka; HTTP and reply later)."""

from __future__ import annotations

from eventbus.eventing.sinks._base import Sink, SinkEncodeError, SinkTooLargeError
from eventbus.eventing.sinks._kafka import KafkaSink, KafkaSinkConfig

__all__ = ["KafkaSink", "KafkaSinkConfig", "Sink", "SinkEncodeError", "SinkTooLargeError"]
