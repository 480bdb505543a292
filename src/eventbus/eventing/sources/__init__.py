"""Sources: where events come from (Kafka topics; HTTP and gRPC through the gateway; schedules)."""

from __future__ import annotations

from eventbus.eventing._signature import sign, sign_request
from eventbus.eventing.sources._base import Source
from eventbus.eventing.sources._http_config import (
    AuthConfig,
    BearerAuthConfig,
    GrpcSourceConfig,
    HmacAuthConfig,
    HttpSourceConfig,
    StandardWebhooksAuthConfig,
    ingress_topic,
)
from eventbus.eventing.sources._kafka import (
    DECODE_ERROR_TYPE,
    DeliveryPolicy,
    FetchSettings,
    KafkaSource,
    KafkaSourceConfig,
    SourceSinks,
)
from eventbus.eventing.sources._schedule_config import ScheduleSourceConfig

__all__ = [
    "AuthConfig",
    "BearerAuthConfig",
    "DECODE_ERROR_TYPE",
    "DeliveryPolicy",
    "FetchSettings",
    "GrpcSourceConfig",
    "HmacAuthConfig",
    "HttpSourceConfig",
    "KafkaSource",
    "KafkaSourceConfig",
    "ScheduleSourceConfig",
    "Source",
    "SourceSinks",
    "StandardWebhooksAuthConfig",
    "ingress_topic",
    "sign",
    "sign_request",
]
