"""Sinks: where output and dead-letter events go (Kafka, HTTP subscribers)."""

from __future__ import annotations

from eventbus.eventing.sinks._base import (
    Sink,
    SinkEncodeError,
    SinkPartialError,
    SinkTooLargeError,
)
from eventbus.eventing.sinks._http import HttpSink
from eventbus.eventing.sinks._http_config import HttpSinkConfig
from eventbus.eventing.sinks._kafka import KafkaSink, KafkaSinkConfig

__all__ = [
    "HttpSink",
    "HttpSinkConfig",
    "KafkaSink",
    "KafkaSinkConfig",
    "Sink",
    "SinkEncodeError",
    "SinkPartialError",
    "SinkTooLargeError",
]
