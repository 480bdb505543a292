"""``delivery: {guarantee: exactly_once}`` on Apache Kafka: a replica's Kafka path (the
``eos_driver`` process: KafkaSource + filter/convert + Kafka sinks, one transaction per batch)
through every fault of ``eos_faults3`` on three brokers (kill -9 mid-transaction, the output
leader's kill, the group coordinator's restart, scale 1 -> 3 -> 1), killed inside a
multi-batch transaction, and a zombie (SIGSTOP past the session timeout, then SIGCONT after
its partitions moved). A ``read_committed`` reader sees every expected output and dead letter
exactly once, in per-key order; a ``read_uncommitted`` reader sees the aborted attempts too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from typing import Any

import pytest

from tests.integration.eos_harness import Driver, checked, expected, produce, read
from tests.integration.test_faults import check_exactly_once_in_key_order

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _apache_kafka_only(broker_kind: str) -> None:
    if broker_kind != "kafka":
        pytest.skip("Tansu delivers aborted transactions' records to read_committed readers")


@pytest.mark.kafka_only
@pytest.mark.timeout(420)
async def test_every_fault_on_three_brokers_exactly_once(kafka_cluster3: Any) -> None:
    """100,000 events through filter + convert on three brokers, through kill -9 of a
    replica mid-transaction (twice), the kill of output partition 0's leader, the restart of
    the group coordinator's broker and scale 1 -> 3 -> 1 (``eos_faults3``): read_committed
    gets every output and dead letter exactly once in per-key order; read_uncommitted sees
    the aborted attempts."""
    from tests.integration.eos_faults3 import every_fault

    n = 100_000
    async with every_fault(kafka_cluster3, "ef", n) as run:
        boot, (_, sink, dlq) = run.bootstrap, run.topics
        await checked(run.everyone, boot, sink, dlq, n)
        # the kills left open transactions that were aborted: their records are in the log
        committed = len(expected(n)[0])
        raw = await read(boot, sink, "read_uncommitted", committed + 1, 20)
        assert len(raw) > committed, "no aborted attempt is in the log"


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
    victim = Driver(kafka_bootstrap, topics, group, 0.02, interval_ms=5000, kill_at="3:1:open")
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
