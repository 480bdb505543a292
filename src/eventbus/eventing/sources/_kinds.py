"""The built-in source kinds: ``kafka``, ``http`` and ``grpc``.

A source kind's factory gives what the pipeline's replicas consume for it, as a
:class:`KafkaSourceConfig`: a ``kafka`` source its own topic; ``http`` and ``grpc`` sources,
which the gateway accepts, the pipeline's ingress topic (trait ``ingress``), where the gateway
writes their events before it answers. The trait ``check_all`` validates every source of one
kind in a pipeline together.
"""

from __future__ import annotations

from typing import Any

from eventbus.eventing.sources._http_config import GrpcSourceConfig, HttpSourceConfig, ingress_topic
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.registry import sources

__all__: list[str] = []


def _unique_paths(configs: list[HttpSourceConfig]) -> None:
    paths: set[str | None] = set()
    for c in configs:
        if c.path in paths:
            shown = c.path or "(no path)"
            msg = f"two http sources share path {shown}; give each http source its own path"
            raise ValueError(msg)
        paths.add(c.path)


def _one_grpc(configs: list[GrpcSourceConfig]) -> None:
    if len(configs) > 1:
        msg = "a pipeline takes at most one grpc source (gRPC calls name the pipeline, not a path)"
        raise ValueError(msg)


def _topics(raw: dict[str, Any]) -> str:
    topics = raw.get("topics") or [raw.get("topic")]
    topics = topics if isinstance(topics, list) else [topics]
    return ", ".join(str(t) for t in topics if t)


@sources.register(
    "kafka", config=KafkaSourceConfig, description="Consume a Kafka topic.", describe=_topics
)
def kafka_source(config: KafkaSourceConfig, pipeline: str) -> KafkaSourceConfig:
    """A Kafka source consumes its own topics."""
    return config


@sources.register(
    "http",
    config=HttpSourceConfig,
    description="Accept events over HTTP at the gateway.",
    ingress=True,
    check_all=_unique_paths,
    describe=lambda raw: raw.get("path") or "",
)
def http_source(config: HttpSourceConfig, pipeline: str) -> KafkaSourceConfig:
    """The gateway writes HTTP events to the pipeline's ingress topic."""
    return KafkaSourceConfig(topic=ingress_topic(pipeline))


@sources.register(
    "grpc",
    config=GrpcSourceConfig,
    description="Accept events over gRPC at the gateway.",
    ingress=True,
    check_all=_one_grpc,
    describe=lambda raw: "",
)
def grpc_source(config: GrpcSourceConfig, pipeline: str) -> KafkaSourceConfig:
    """The gateway writes gRPC events to the pipeline's ingress topic."""
    return KafkaSourceConfig(topic=ingress_topic(pipeline))
