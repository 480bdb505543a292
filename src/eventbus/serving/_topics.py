"""The topics the controller creates: a pipeline's ingress topic at each deploy, and before a
restore the topics a broker restarted without storage lost."""

from __future__ import annotations

import asyncio

from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.pipelines._config import PipelineConfig

__all__ = ["create_ingress_topic", "create_missing_topics"]


def create_ingress_topic(
    config: PipelineConfig, bootstrap: str, client: KafkaClientConfig | None
) -> None:
    """Create the topic the gateway writes the pipeline's HTTP/gRPC events to, with one
    partition per replica it may have (so every replica consumes), and at least one per
    gateway producer (each writes its own partitions). Nothing without an ingress source."""
    from eventbus._internal.services import create_topics
    from eventbus.eventing.sources._http_config import GATEWAY_PRODUCERS, ingress_topic
    from eventbus.registry import sources

    if not any(sources.get(s.kind).trait("ingress") for s in config.spec.sources):
        return
    partitions = max(GATEWAY_PRODUCERS, config.spec.serving.replica_bounds.max)
    asyncio.run(create_topics(bootstrap, [ingress_topic(config.name)], partitions, client=client))


def create_missing_topics(
    config: PipelineConfig, bootstrap: str, client: KafkaClientConfig | None
) -> None:
    """Before a restore: a broker that restarted without storage (the embedded one keeps
    topics in memory) lost the pipeline's topics; create the missing ones (sources', sinks'
    and the ingress topic), each on its own cluster with that cluster's settings."""
    from eventbus._internal.services import create_topics

    spec = config.spec
    partitions = max(2, spec.serving.replica_bounds.max)
    wanted: dict[str, list[str]] = {}
    # per cluster, the connection settings of the first component naming it (None: stack's)
    clients: dict[str, KafkaClientConfig | None] = {}
    for src in spec.sources:
        if src.kafka is not None:
            cluster = src.kafka.bootstrap_servers or bootstrap
            wanted.setdefault(cluster, []).extend(src.kafka.topics)
            clients.setdefault(cluster, src.kafka.client)
    for sink in spec.output_paths().values():
        if sink.kafka is not None:
            cluster = sink.kafka.bootstrap_servers or bootstrap
            wanted.setdefault(cluster, []).append(sink.kafka.topic)
            clients.setdefault(cluster, sink.kafka.client)
    for cluster, topics in wanted.items():
        asyncio.run(
            create_topics(cluster, topics, partitions, client=clients.get(cluster) or client)
        )
    create_ingress_topic(config, bootstrap, client)
