"""``delivery: {guarantee: exactly_once}`` on Apache Kafka: a replica's Kafka path (the
``eos_driver`` process: KafkaSource + filter/convert + Kafka sinks, one transaction per batch)
killed with SIGKILL several times mid-stream, and a zombie (SIGSTOP past the session timeout,
then SIGCONT after its partitions moved). A ``read_committed`` reader sees every expected
output and dead letter exactly once, in per-key order; a ``read_uncommitted`` reader sees the
aborted attempts too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from eventbus.eventing.sources._kafka_txn import transactional_id
from tests.integration.eos_harness import Driver, checked, expected, produce, read
from tests.integration.test_faults import check_exactly_once_in_key_order

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]

#: Input events a second while the drivers scale and the coordinator restarts.
RATE = 600


@pytest.fixture(autouse=True)
def _apache_kafka_only(broker_kind: str) -> None:
    if broker_kind != "kafka":
        pytest.skip("Tansu delivers aborted transactions' records to read_committed readers")


async def test_kill_9_mid_stream_exactly_once(topic_factory: Any, kafka_bootstrap: str) -> None:
    n = 100_000
    topics = (
        topic_factory("x-in", partitions=4),
        topic_factory("x-out", partitions=4),
        topic_factory("x-dlq"),
    )
    group = f"eos-{topics[0]}"
    drivers = [Driver(kafka_bootstrap, topics, group, 0.02) for _ in range(2)]
    everyone = list(drivers)
    try:
        for d in drivers:
            await asyncio.to_thread(d.wait_ready)
        done = [0]
        producing = asyncio.create_task(produce(kafka_bootstrap, topics[0], n, 20.0, done))
        for mark in (0.2, 0.45, 0.7):  # kill -9 one replica, start another, three times
            while done[0] < n * mark:
                await asyncio.sleep(0.05)
            victim = drivers.pop(0)
            # a replacement started at the mark before may still be starting (its handler of
            # SIGUSR2 not installed yet: the signal would kill it outside any transaction)
            await asyncio.to_thread(victim.wait_ready)
            # the victim kills itself (SIGKILL) at the first moment an open transaction of it
            # holds sent batches: every kill lands inside a transaction
            victim.signal(signal.SIGUSR2)
            died = await asyncio.to_thread(victim.wait_dead, 60)
            assert died == -signal.SIGKILL, f"the victim did not die by SIGKILL: {died}"
            victim.stop()
            drivers.append(Driver(kafka_bootstrap, topics, group, 0.02))
            everyone.append(drivers[-1])
        await producing
        await checked(everyone, kafka_bootstrap, topics[1], topics[2], n)
        # the kills left open transactions that were aborted: their records are in the log
        committed = len(expected(n)[0])
        raw = await read(kafka_bootstrap, topics[1], "read_uncommitted", committed + 1, 20)
        assert len(raw) > committed, "no aborted attempt is in the log"
    finally:
        for d in drivers:
            d.stop()


async def test_kill_9_inside_a_multi_batch_transaction(
    topic_factory: Any, kafka_bootstrap: str
) -> None:
    """A commit interval long enough that each transaction holds many batches: the replica is
    killed with SIGKILL while its open transaction holds several sent batches. Every batch of
    it is aborted and consumed again by the next replica: nothing lost, nothing twice; and the
    last transactions commit once traffic stops (nothing held back for the interval)."""
    n = 12_000
    topics = (
        topic_factory("m-in", partitions=2),
        topic_factory("m-out", partitions=2),
        topic_factory("m-dlq"),
    )
    group = f"eos-{topics[0]}"
    # one transaction committed (the partitions are owned), and an open one holding several
    # sent batches: the victim kills itself (SIGKILL) at that moment, once armed
    victim = Driver(kafka_bootstrap, topics, group, 0.02, interval_ms=5000, kill_at="3:1")
    heir: Driver | None = None
    try:
        await asyncio.to_thread(victim.wait_ready)
        victim.signal(signal.SIGUSR2)
        done = [0]
        producing = asyncio.create_task(produce(kafka_bootstrap, topics[0], n, 8.0, done))
        died = await asyncio.to_thread(victim.wait_dead, 90)
        assert died == -signal.SIGKILL, f"no open transaction held 3 batches: {victim.stats}"
        victim.stop()
        heir = Driver(kafka_bootstrap, topics, group, 0.02, interval_ms=5000)
        await producing
        await checked([victim, heir], kafka_bootstrap, topics[1], topics[2], n)
        # the killed transaction's records are in the log, aborted
        committed = len(expected(n)[0])
        raw = await read(kafka_bootstrap, topics[1], "read_uncommitted", committed + 1, 20)
        assert len(raw) > committed, "no aborted attempt is in the log"
        # transactions held several batches each, and none is left open once traffic stopped
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            heir.stats.get("txn_waiting", 1) or heir.stats.get("in_flight", 1)
        ):
            await asyncio.sleep(0.05)
        assert heir.stats["txn_waiting"] == heir.stats["in_flight"] == 0, heir.stats
        assert heir.stats["batches"] > heir.stats["txn_commits"] > 0, heir.stats
    finally:
        victim.stop()
        if heir is not None:
            heir.stop()


async def test_zombie_is_fenced(topic_factory: Any, kafka_bootstrap: str) -> None:
    n = 6_000
    topics = (
        topic_factory("z-in", partitions=2),
        topic_factory("z-out", partitions=2),
        topic_factory("z-dlq"),
    )
    group = f"eos-{topics[0]}"
    zombie = Driver(kafka_bootstrap, topics, group, 0.3)  # slow steps: mostly mid-transaction
    heir: Driver | None = None
    try:
        await asyncio.to_thread(zombie.wait_ready)
        done = [0]
        producing = asyncio.create_task(produce(kafka_bootstrap, topics[0], n, 6.0, done))
        while zombie.stats.get("committed", 0) < 500:
            await asyncio.sleep(0.05)
        zombie.signal(signal.SIGSTOP)
        heir = Driver(kafka_bootstrap, topics, group, 0.0)
        await asyncio.to_thread(heir.wait_ready, 90)  # joined after the zombie's session ended
        while heir.stats.get("committed", 0) == 0:  # it fenced the zombie's producers
            await asyncio.sleep(0.05)
        zombie.signal(signal.SIGCONT)
        await producing
        await checked([zombie, heir], kafka_bootstrap, topics[1], topics[2], n)
        # the zombie went on with the batches it had in flight: refused (fenced), not committed
        deadline = time.monotonic() + 30
        while zombie.stats.get("txn_fenced", 0) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert zombie.stats.get("txn_fenced", 0) >= 1, zombie.stats
    finally:
        zombie.stop()
        if heir is not None:
            heir.stop()


@pytest.mark.ray
@pytest.mark.redis
async def test_kill_9_of_a_serve_replica_exactly_once(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str
) -> None:
    """The deployed path: an exactly_once pipeline on a Ray Serve replica killed with SIGKILL
    mid-run (test_faults' run, without dedupe and without Redis in the delivery): a
    read_committed reader gets every event once, in key order."""
    from tests.integration.test_faults import N, doc, replica_pid, run_with_fault

    src, sink, dlq = (
        topic_factory("r-in", partitions=4),
        topic_factory("r-out", partitions=4),
        topic_factory("r-dlq"),
    )
    name = f"eos-replica-{uuid.uuid4().hex[:6]}"
    pipeline = doc(name, src, sink, dlq)
    pipeline["spec"]["delivery"] = {"guarantee": "exactly_once"}
    deploy_pipeline(pipeline)
    victim = await asyncio.to_thread(replica_pid, name)
    want = {f"f{i}" for i in range(N)}
    out = await run_with_fault(
        kafka_bootstrap, src, sink, lambda: os.kill(victim, signal.SIGKILL), want
    )
    check_exactly_once_in_key_order(out, want)
    assert await asyncio.to_thread(replica_pid, name) != victim


@pytest.mark.kafka_only
@pytest.mark.timeout(300)
async def test_output_leader_kill_on_three_brokers(kafka_cluster3: Any) -> None:
    """Three brokers (replication 3, min.insync.replicas 2, the transaction log likewise):
    kill -9 the leader of output partition 0 mid-stream. The transactions in flight to it
    abort or retry on the new leader; read_committed still gets every output exactly once in
    per-key order."""
    from tests.integration.kafka3 import cluster_healthy, create_topics, placement

    cluster = kafka_cluster3
    await cluster_healthy(cluster)
    boot = cluster.bootstrap
    controller = (await asyncio.to_thread(cluster.active_controller)).node_id
    victim = max({1, 2, 3} - {controller})
    others = [x for x in (1, 2, 3) if x != victim]
    base = {p: others[p % 2] for p in range(4)}
    tag = uuid.uuid4().hex[:6]
    topics = (f"e3-in-{tag}", f"e3-out-{tag}", f"e3-dlq-{tag}")
    await create_topics(
        boot,
        {
            topics[0]: placement(base),
            topics[1]: placement({**base, 0: victim}),
            topics[2]: placement({0: others[0]}),
        },
    )
    n = 20_000
    driver = Driver(boot, topics, f"eos3-{tag}", 0.02)
    try:
        await asyncio.to_thread(driver.wait_ready)
        done = [0]
        producing = asyncio.create_task(produce(boot, topics[0], n, 8.0, done))
        while done[0] < n * 0.3:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(cluster.nodes[victim - 1].signal, signal.SIGKILL)
        await producing
        await checked([driver], boot, topics[1], topics[2], n)
    finally:
        driver.stop()
        await cluster_healthy(cluster)  # the next test gets three nodes


async def coordinated_group(
    bootstrap: str, source: str, partitions: int, controller: int
) -> tuple[str, int, list[int]]:
    """A consumer group for ``source`` whose coordinator also coordinates the transactions of
    some of its input partitions (FindCoordinator of the group and of each partition's
    transactional id): the group, that node and those partitions. A node but the active KRaft
    controller where one can (its fault is then not the controller's failover too)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    fallback: tuple[str, int, list[int]] | None = None
    try:
        deadline = time.monotonic() + 60
        for i in range(100):
            group = f"eosc-{source}-{i}"
            ids = [transactional_id(group, TopicPartition(source, p)) for p in range(partitions)]
            while True:
                try:  # (the coordinators' internal topics may be being created)
                    node = await admin.find_coordinator(group)
                    txns = [await admin.find_coordinator(t, 1) for t in ids]
                    break
                except KafkaError:
                    assert time.monotonic() < deadline, "no group or transaction coordinator"
                    await asyncio.sleep(0.1)
            shared = [p for p, c in enumerate(txns) if c == node]
            if shared and node != controller:
                return group, node, shared
            fallback = fallback or ((group, node, shared) if shared else None)
    finally:
        await admin.close()
    assert fallback is not None, "no group whose coordinator coordinates a transaction of it"
    return fallback


@pytest.mark.kafka_only
@pytest.mark.timeout(300)
async def test_coordinator_restart_and_scale_1_3_1_on_three_brokers(kafka_cluster3: Any) -> None:
    """Three brokers, events flowing throughout: one driver, then two more join (three); the
    broker that coordinates the drivers' group and some of their transactions is killed
    (SIGKILL) and started again; then the two stop gracefully (SIGTERM: one driver again).
    read_committed gets every output exactly once in per-key order."""
    from tests.integration.broker_faults import wait_until
    from tests.integration.kafka3 import cluster_healthy, create_topics, placement

    cluster = kafka_cluster3
    await cluster_healthy(cluster)
    boot = cluster.bootstrap
    controller = (await asyncio.to_thread(cluster.active_controller)).node_id
    tag = uuid.uuid4().hex[:6]
    topics = (f"ec-in-{tag}", f"ec-out-{tag}", f"ec-dlq-{tag}")
    group, victim, shared = await coordinated_group(boot, topics[0], 4, controller)
    others = [x for x in (1, 2, 3) if x != victim]  # the partitions' leaders stay up
    base = {p: others[p % 2] for p in range(4)}
    await create_topics(
        boot,
        {
            topics[0]: placement(base),
            topics[1]: placement(base),
            topics[2]: placement({0: others[0]}),
        },
    )
    first = Driver(boot, topics, group, 0.02)
    everyone = [first]
    stop, done = asyncio.Event(), [0]
    producing: asyncio.Task[None] | None = None

    def committed() -> int:
        return sum(d.stats.get("committed", 0) for d in everyone)

    try:
        await asyncio.to_thread(first.wait_ready)
        # RATE events a second until told to stop (at most 10**6)
        producing = asyncio.create_task(produce(boot, topics[0], 10**6, 10**6 / RATE, done, stop))
        await wait_until(lambda: first.stats.get("committed", 0) > 0, "a first commit", 60)
        joined = [Driver(boot, topics, group, 0.02) for _ in range(2)]  # scale 1 -> 3
        everyone += joined
        for d in joined:
            await asyncio.to_thread(d.wait_ready)
        await wait_until(
            lambda: all(d.stats.get("committed", 0) > 0 for d in joined),
            "the joined drivers' first commits (they own partitions)",
            90,
        )
        admin = AIOKafkaAdminClient(bootstrap_servers=boot, request_timeout_ms=10_000)
        await admin.start()
        try:  # still (a coordinator moves only when a broker fails)
            assert await admin.find_coordinator(group) == victim, "the coordinator moved"
        finally:
            await admin.close()
        print(f"node {victim} coordinates the group and the transactions of {shared}")
        node = cluster.nodes[victim - 1]
        await asyncio.to_thread(node.signal, signal.SIGKILL)
        await asyncio.to_thread(cluster.start_node, node)
        mark = committed()
        await wait_until(lambda: committed() > mark + 2 * RATE, "commits after the restart", 90)
        for d in joined:  # scale 3 -> 1, gracefully
            d.signal(signal.SIGTERM)
        for d in joined:
            assert await asyncio.to_thread(d.wait_dead, 60) == 0, "a graceful stop failed"
        mark = first.stats["committed"]
        await wait_until(
            lambda: first.stats["committed"] > mark + 2 * RATE, "commits after the scale-in", 90
        )
        stop.set()
        await producing
        await checked(everyone, boot, topics[1], topics[2], done[0])
        assert all(d.stats.get("committed", 0) > 0 for d in everyone), "a driver owned nothing"
    finally:
        stop.set()
        if producing is not None:
            await asyncio.gather(producing, return_exceptions=True)
        for d in everyone:
            d.stop()
        await cluster_healthy(cluster)  # the next test gets three nodes
