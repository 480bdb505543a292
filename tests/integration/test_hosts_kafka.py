"""A three-broker Apache Kafka over three test hosts (network namespaces, see
``tests/fixtures/netns_hosts.py``): node i runs inside host i, listening on and advertising that
host's address, the KRaft quorum and the replication cross the hosts' bridge, and clients in the
root namespace reach every broker over it.

A cut of one broker's host for 10 s (its link down: the process keeps running, cut off) while a
producer with ``acks=all`` keeps sending: the other two keep ``min.insync.replicas`` (2), the
partition the cut broker led moves, the producer keeps being acknowledged during the cut, and
after the heal every acknowledged record is there and the cut broker is back in sync. Nodes run with 256 MB heaps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from eventbus._internal.kafka_broker import KafkaCluster, start_kafka_cluster
from eventbus.errors import StackError
from tests.fixtures.netns_hosts import TestHosts
from tests.integration.kafka3 import create_topics, leaders, placement

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.kafka_only,
    pytest.mark.slow,
]

CUT_S = 10.0


@pytest.fixture(scope="module")
def hosts(make_hosts: Callable[[int], TestHosts]) -> TestHosts:
    return make_hosts(3)


@pytest.fixture(scope="module")
def cluster(hosts: TestHosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    kafka = start_kafka_cluster(
        home=tmp_path_factory.mktemp("kafka-hosts"),
        n_nodes=3,
        heap_mb=256,
        hosts=[h.address for h in hosts],
        launchers=[h.launcher for h in hosts],
    )
    try:
        yield kafka
    finally:
        kafka.stop(5)  # the hosts go too: no need for a controlled shutdown


def test_one_node_per_host_and_a_round_trip_from_the_root_namespace(
    hosts: TestHosts, cluster: KafkaCluster
) -> None:
    for host, node in zip(hosts, cluster.nodes, strict=True):
        assert node.address == f"{host.address}:{node.port}"
        assert node.pid in host.pids()  # the JVM runs inside its host's namespace
    props = (cluster.nodes[1].home / "server.properties").read_text()
    assert f"advertised.listeners=PLAINTEXT://{hosts[1].address}:" in props
    assert f"1@{hosts[0].address}:" in props and f"3@{hosts[2].address}:" in props  # voters

    async def main() -> None:
        await create_topics(cluster.bootstrap, {"rt": placement({0: 1, 1: 2, 2: 3})})
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
        await producer.start()
        try:
            for i in range(30):
                await producer.send_and_wait("rt", str(i).encode(), partition=i % 3)
        finally:
            await producer.stop()
        got = await _read("rt", cluster.bootstrap, {str(i) for i in range(30)}, 60)
        assert got == {str(i) for i in range(30)}

    asyncio.run(main())


async def _read(topic: str, bootstrap: str, want: set[str], timeout_s: float) -> set[str]:
    """Read ``topic`` from the beginning until every value of ``want`` came (or time is up)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    got: set[str] = set()
    try:
        deadline = time.monotonic() + timeout_s
        while not want <= got and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.update(r.value.decode() for r in records if r.value is not None)
    finally:
        await consumer.stop()
    return got


def test_a_cut_broker_host_loses_no_acknowledged_record(
    hosts: TestHosts, cluster: KafkaCluster
) -> None:
    cut = hosts[1]  # node 2: it leads partition 1 of the topic

    async def main() -> None:
        await create_topics(cluster.bootstrap, {"cut": placement({0: 1, 1: 2, 2: 3})})
        assert (await leaders(cluster.bootstrap, "cut", 3))[1] == 2
        producer = AIOKafkaProducer(
            bootstrap_servers=cluster.bootstrap,
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=4000,
            retry_backoff_ms=200,
        )
        await producer.start()
        acked: dict[str, float] = {}  # value -> when it was acknowledged
        stop = asyncio.Event()

        async def send(partition: int) -> None:
            n = 0
            while not stop.is_set():
                value = f"{partition}-{n}"
                try:  # a failed send is sent again: duplicates allowed, loss not
                    await producer.send_and_wait("cut", value.encode(), partition=partition)
                except KafkaError:
                    await asyncio.sleep(0.2)
                    continue
                acked[value] = time.monotonic()
                n += 1
                await asyncio.sleep(0.02)

        senders = [asyncio.create_task(send(p)) for p in range(3)]
        try:
            while len(acked) < 30:  # sending before the cut
                await asyncio.sleep(0.1)
            cut.cut()
            cut_at = time.monotonic()
            try:
                await asyncio.sleep(CUT_S)  # the partition's duration, not a wait for a result
            finally:
                cut.heal()
            healed_at = time.monotonic()
            during = [v for v, t in acked.items() if cut_at < t < healed_at]
            # every partition, the cut broker's too (its leadership moved), was acknowledged
            # with acks=all during the cut: two in-sync replicas out of three are enough
            assert {v.split("-")[0] for v in during} == {"0", "1", "2"}, during
            n_after = len(acked)
            while len(acked) < n_after + 30:  # and sending after the heal
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await asyncio.gather(*senders, return_exceptions=True)
            await producer.stop()
        got = await _read("cut", cluster.bootstrap, set(acked), 90)
        lost = set(acked) - got
        assert not lost, f"{len(lost)} acknowledged records lost: {sorted(lost)[:20]}"
        await _in_sync(cluster.bootstrap, "cut", 3, 90)  # the cut broker caught up again
        print(f"acked {len(acked)}, {len(during)} during the {CUT_S:g} s cut")

    asyncio.run(main())


async def _in_sync(bootstrap: str, topic: str, n: int, timeout_s: float) -> None:
    """Wait until every partition of ``topic`` has all ``n`` replicas in sync."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            (desc,) = await admin.describe_topics([topic])
            isr = {p["partition"]: sorted(p["isr"]) for p in desc["partitions"]}
            if all(len(r) == n for r in isr.values()):
                return
            assert time.monotonic() < deadline, f"{topic}: in-sync replicas {isr}"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


def test_hosts_and_launchers_must_name_one_per_node(tmp_path: Path) -> None:
    with pytest.raises(StackError, match=r"hosts=\['10.0.0.1'\] names 1 nodes for a cluster of 3"):
        KafkaCluster(tmp_path, 3, hosts=["10.0.0.1"])
    with pytest.raises(StackError, match="launchers=.*names 2 nodes"):
        KafkaCluster(tmp_path, 3, launchers=[["ip"], ["ip"]])
