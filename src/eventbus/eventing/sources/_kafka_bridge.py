"""The join bridge's consumer: every partition of a source's topics by assignment, for the time
a consumer-group join takes (see :class:`~eventbus.eventing.sources._kafka_settings.JoinBridge`).

Tansu holds a JoinGroup for half the group's session timeout (``join_group_pause`` in its group
coordinator), so the first member of a group waits seconds before its first fetch (Apache
Kafka answers one in tens of ms: the controller opens bridges on Tansu only). A consumer with
the same ``group_id`` that assigns itself the partitions needs no join: its positions come
from the group's committed offsets (``OffsetFetch``). Once the group has a member, the group
takes commits only from members (Tansu as Kafka): what the bridge consumer delivered is
committed by the source's member when it gets its partitions (the hand-over). It is safe only
while no other consumer reads those partitions: the bridge is claimed once per wake-up, and
other new members join only after its release.
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

__all__ = ["open_bridge"]

log = logging.getLogger("eventbus.eventing.sources._kafka")


async def open_bridge(
    topics: list[str], group: str, kwargs: dict[str, Any]
) -> AIOKafkaConsumer | None:
    """A started consumer of ``group`` assigned every partition of ``topics``, or None when a
    topic has no partitions yet (created on first produce) or the broker refused: the source
    then waits for its group join as usual."""
    consumer = AIOKafkaConsumer(group_id=group, **kwargs)
    try:
        await consumer.start()
        await consumer.topics()  # the cluster's metadata, with every topic's partitions
        tps: list[TopicPartition] = []
        for topic in topics:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                await consumer.stop()
                return None
            tps.extend(TopicPartition(topic, p) for p in sorted(parts))
        consumer.assign(tps)
    except (KafkaError, KeyError) as e:
        log.warning("kafka source of group %r: no join bridge (%s); joining as usual", group, e)
        await consumer.stop()
        return None
    return consumer
