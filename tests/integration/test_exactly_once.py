"""``delivery: {guarantee: exactly_once}`` on Apache Kafka: a replica's Kafka path (the
``eos_driver`` process: KafkaSource + filter/convert + Kafka sinks, one transaction per batch)
killed with SIGKILL several times mid-stream, and a zombie (SIGSTOP past the session timeout,
then SIGCONT after its partitions moved). A ``read_committed`` reader sees every expected
output and dead letter exactly once, in per-key order; a ``read_uncommitted`` reader sees the
aborted attempts too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from eventbus import CloudEvent
from eventbus.eventing._codecs import decode_kafka, encode_kafka_binary
from tests.integration.test_faults import check_exactly_once_in_key_order

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]

KEYS = 40
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _apache_kafka_only(broker_kind: str) -> None:
    if broker_kind != "kafka":
        pytest.skip("Tansu delivers aborted transactions' records to read_committed readers")


class Driver:
    """One ``eos_driver`` process; its last counters are kept from its stdout."""

    def __init__(
        self,
        bootstrap: str,
        topics: tuple[str, str, str],
        group: str,
        delay_s: float,
        interval_ms: int = 100,
    ):
        env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
        # EOS_LOG=FILE: the drivers' logs go there too (debugging); each driver's own log is
        # kept so that a failed check shows what the drivers warned of
        self.log_path = Path(tempfile.mkstemp(prefix="eos-driver-", suffix=".log")[1])
        self._log = open(env.get("EOS_LOG", self.log_path), "a")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.eos_driver",
                bootstrap,
                *topics,
                group,
                str(delay_s),
                str(interval_ms),
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            cwd=ROOT,
            text=True,
        )
        self.ready = threading.Event()
        self.stats: dict[str, int] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ready"):
                self.ready.set()
            elif line.startswith("{"):
                self.stats = json.loads(line)

    def wait_ready(self, timeout_s: float = 60) -> None:
        assert self.ready.wait(timeout_s), "the driver did not join its group"

    def wait_dead(self, timeout_s: float) -> int | None:
        """The process's return code once it ended, or None after ``timeout_s``."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)  # the pipe ended with the process
        self._log.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def warnings_of(drivers: list[Driver]) -> str:
    """What the drivers logged at WARNING or above (shown when a check fails)."""
    lines = []
    for d in drivers:
        if d.log_path.exists():
            text = d.log_path.read_text(errors="replace")
            lines += [ln for ln in text.splitlines() if " WARNING " in ln or " ERROR " in ln]
    return "\n".join(lines[-60:])


async def checked(drivers: list[Driver], *args: Any) -> list[CloudEvent]:
    """:func:`check`, with the drivers' warnings added to a failure's message."""
    try:
        return await check(*args)
    except AssertionError as e:
        stats = "\n".join(json.dumps(d.stats) for d in drivers)
        msg = f"{e}\n-- the drivers' counters:\n{stats}\n-- their warnings:\n{warnings_of(drivers)}"
        raise AssertionError(msg) from e


def event(i: int, seq: Counter[str]) -> tuple[str, CloudEvent]:
    key = f"k{i % KEYS}"
    seq[key] += 1
    data: dict[str, Any] = {"n": i, "key": key, "seq": seq[key]}
    if i % 50 == 0:
        data["boom"] = True  # fails the convert: a dead letter
    return key, CloudEvent.create(type="e.test", source="/eos", id=f"e{i}", data=data)


async def produce(bootstrap: str, topic: str, n: int, seconds: float, done: list[int]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)
    await producer.start()
    seq: Counter[str] = Counter()
    start = time.monotonic()
    try:
        for base in range(0, n, 500):
            futs = []
            for i in range(base, min(n, base + 500)):
                key, e = event(i, seq)
                headers, value = encode_kafka_binary(e)
                futs.append(await producer.send(topic, value, key=key.encode(), headers=headers))
            await asyncio.gather(*futs)
            done[0] = min(n, base + 500)
            due = start + seconds * done[0] / n
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())  # pacing the producer
    finally:
        await producer.stop()


async def read(bootstrap: str, topic: str, isolation: str, until: int, timeout_s: float) -> list:
    """Every record of ``topic`` as events, until ``until`` arrived (then 1 s more)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation,
    )
    await consumer.start()
    out: list[CloudEvent] = []
    deadline = time.monotonic() + timeout_s
    extra: float | None = None
    try:
        while time.monotonic() < deadline and (extra is None or time.monotonic() < extra):
            data = await consumer.getmany(timeout_ms=200, max_records=5000)
            for tp, records in data.items():
                out += [
                    decode_kafka(
                        r.value,
                        list(r.headers or ()),
                        key=r.key,
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=r.offset,
                        default_type="x",
                        default_source="x",
                    )
                    for r in records
                ]
            if extra is None and len(out) >= until:
                extra = time.monotonic() + 1.0
    finally:
        await consumer.stop()
    return out


def expected(n: int) -> tuple[set[str], set[str]]:
    outputs = {f"e{i}" for i in range(0, n, 2) if i % 50}
    dead = {f"e{i}" for i in range(0, n, 50)}
    return outputs, dead


async def check(bootstrap: str, sink: str, dlq: str, n: int) -> list[CloudEvent]:
    want_out, want_dead = expected(n)
    out = await read(bootstrap, sink, "read_committed", len(want_out), 120)
    missing = sorted(int(i[1:]) for i in want_out - {e.id for e in out})
    assert not missing, f"missing {len(missing)} outputs: e{missing[:20]} ... e{missing[-5:]}"
    check_exactly_once_in_key_order(out, want_out)
    assert all(e.data["half"] == e.data["n"] / 2 for e in out)
    dead = await read(bootstrap, dlq, "read_committed", len(want_dead), 60)
    counts = Counter(e.id for e in dead)
    assert set(counts) == want_dead and max(counts.values()) == 1, counts.most_common(3)
    return out


async def test_kill_9_mid_stream_exactly_once(topic_factory: Any, kafka_bootstrap: str) -> None:
    n = 20_000
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
        producing = asyncio.create_task(produce(kafka_bootstrap, topics[0], n, 8.0, done))
        for mark in (0.2, 0.45, 0.7):  # kill -9 one replica, start another, three times
            while done[0] < n * mark:
                await asyncio.sleep(0.05)
            victim = drivers.pop(0)
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
    victim = Driver(kafka_bootstrap, topics, group, 0.02, interval_ms=5000)
    heir: Driver | None = None
    try:
        await asyncio.to_thread(victim.wait_ready)
        done = [0]
        producing = asyncio.create_task(produce(kafka_bootstrap, topics[0], n, 8.0, done))
        # one transaction committed (the partitions are owned), and an open one holding
        # several sent batches: the kill lands inside it
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (
            victim.stats.get("txn_commits", 0) >= 1 and victim.stats.get("txn_waiting", 0) >= 3
        ):
            await asyncio.sleep(0.02)
        assert victim.stats.get("txn_waiting", 0) >= 3, victim.stats
        victim.signal(signal.SIGKILL)
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
