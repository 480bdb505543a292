"""Helpers for tests on the three-node Apache Kafka cluster (fixture ``kafka_cluster3``):
topics with placed leaders, consumer groups picked by their coordinator, the partitions'
leaders, and bringing stopped nodes back."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from eventbus._internal.kafka_broker import KafkaCluster

__all__ = [
    "cluster_healthy",
    "coordinators",
    "create_topics",
    "groups_coordinated",
    "leaders",
    "placement",
]


def placement(leads: dict[int, int], nodes: Sequence[int] = (1, 2, 3)) -> dict[int, list[int]]:
    """A replica assignment: partition -> [its leader, the other nodes] (replication 3)."""
    return {p: [leader, *(n for n in nodes if n != leader)] for p, leader in leads.items()}


async def create_topics(bootstrap: str, topics: dict[str, dict[int, list[int]]]) -> None:
    """Create topics with the given replica assignments (the first replica leads), trying
    again while a broker that was just restarted is not registered yet."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        deadline = time.monotonic() + 60
        todo = dict(topics)
        while todo:
            answer = await admin.create_topics(
                [NewTopic(t, -1, -1, replica_assignments=a) for t, a in todo.items()],
                timeout_ms=10_000,
            )
            errors = {t: (code, rest) for t, code, *rest in answer.topic_errors if code}
            todo = {t: a for t, a in todo.items() if t in errors and errors[t][0] != 36}
            if todo and time.monotonic() > deadline:
                raise AssertionError(f"topics not created: {errors}")
            if todo:
                await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def groups_coordinated(
    bootstrap: str, prefix: str, count: int, by: Any, attempts: int = 200
) -> list[str]:
    """``count`` group ids ``{prefix}-<n>`` whose coordinator's node id satisfies ``by``
    (asked with FindCoordinator: the leader of the group's ``__consumer_offsets`` partition)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    out: list[str] = []
    try:
        deadline = time.monotonic() + 60
        n = 0
        while len(out) < count:
            group = f"{prefix}-{n}"
            try:
                node = await admin.find_coordinator(group)
            except KafkaError:  # __consumer_offsets being created, a coordinator moving
                assert time.monotonic() < deadline, "no group coordinator"
                await asyncio.sleep(0.1)
                continue
            n += 1
            assert n < attempts, f"no group of {prefix} coordinated as wanted"
            if by(node):
                out.append(group)
    finally:
        await admin.close()
    return out


async def coordinators(bootstrap: str) -> Counter[int]:
    """Node id -> how many ``__consumer_offsets`` partitions it leads (for how many groups
    it can be the coordinator); the topic is made first if it is not there yet."""
    await groups_coordinated(bootstrap, "bf-probe", 1, lambda _: True)
    return Counter((await leaders(bootstrap, "__consumer_offsets", 10)).values())


async def leaders(bootstrap: str, topic: str, partitions: int = 4) -> dict[int, int]:
    """Partition -> its leader's node id."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            (desc,) = await admin.describe_topics([topic])
            found = {p["partition"]: p["leader"] for p in desc["partitions"]}
            if len(found) == partitions and all(v >= 0 for v in found.values()):
                return found
            assert time.monotonic() < deadline, f"{topic}: leaders {found}"
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def cluster_healthy(cluster: KafkaCluster, timeout_s: float = 120.0) -> None:
    """Start the nodes that are down; wait until every broker is registered and back in the
    in-sync replicas of ``__consumer_offsets`` (a node that was down catches up first: until
    then a fault on another node would leave its partitions below ``min.insync.replicas``)."""
    down = [n for n in cluster.nodes if not n.pid]
    for node in down:
        await asyncio.to_thread(cluster.start_node, node)
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=5000)
    await admin.start()
    n = len(cluster.nodes)
    try:
        deadline = time.monotonic() + timeout_s
        while len((await admin.describe_cluster())["brokers"]) < n:
            assert time.monotonic() < deadline, "a broker did not register"
            await asyncio.sleep(0.2)
        while True:
            (desc,) = await admin.describe_topics(["__consumer_offsets"])
            if desc["error_code"] or all(len(p["isr"]) == n for p in desc["partitions"]):
                return  # all in sync, or no group ever made the topic
            assert time.monotonic() < deadline, f"__consumer_offsets not in sync: {desc}"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
