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
    topics in memory) lost the pipeline's topics, which existed (or were created) at its
    deploy; create the missing ones (sources', sinks' and the ingress topic; ``create:``'s
    partitions, else one per replica, at least 2), each on its own cluster with its settings."""
    from eventbus._internal.services import create_topics
    from eventbus.serving._topic_checks import kafka_topics

    default = max(2, config.spec.serving.replica_bounds.max)
    for cluster_at, cluster in kafka_topics(config, bootstrap, client).items():
        by_count: dict[int, list[str]] = {}  # one admin call per partition count
        for _, topic, create in cluster.topics:
            count = (create.partitions if create else None) or default
            by_count.setdefault(count, []).append(topic)
        for partitions, topics in by_count.items():
            asyncio.run(create_topics(cluster_at, topics, partitions, client=cluster.client))
    create_ingress_topic(config, bootstrap, client)
