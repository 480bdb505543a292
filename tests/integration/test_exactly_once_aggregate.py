"""``delivery: {guarantee: exactly_once}`` through an aggregate on Apache Kafka: 20,000
events with event times 5 ms apart (one input partition: in time order, so no event is late)
counted per key over one-second tumbling windows while a replica's Kafka path
(``eos_driver``) is killed with SIGKILL inside an open transaction, twice, and replaced. The
windows close as the consumed events move the watermark past them, inside their batch's
transaction; the batches consumed again after an abort are not counted twice and re-emit the
windows they closed. A ``read_committed`` reader sees every window once, with its count and
sum, in per-key window order; a ``read_uncommitted`` reader sees the aborted attempts too.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from eventbus import CloudEvent
from eventbus._internal import keys
from eventbus.eventing._codecs import encode_kafka_binary
from tests.integration.eos_harness import Driver, read, warnings_of

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]

N = 20_000
KEYS = 40
STEP_MS = 5  # event time between two events: 200 events (5 a key) a one-second window
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000


@pytest.fixture(autouse=True)
def _apache_kafka_only(broker_kind: str) -> None:
    if broker_kind != "kafka":
        pytest.skip("Tansu delivers aborted transactions' records to read_committed readers")


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def expected() -> dict[tuple[str, str], tuple[int, int]]:
    """(key, window start) -> (count, sum of n) of every window the input closes."""
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for i in range(N):
        t = T0 + i * STEP_MS
        w = out[(f"k{i % KEYS}", iso(t - t % 1000))]
        w[0] += 1
        w[1] += i
    return {k: (v[0], v[1]) for k, v in out.items()}


async def produce(bootstrap: str, topic: str, done: list[int]) -> None:
    """Events 0..N-1, then one far ahead in event time that closes the last windows."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)
    await producer.start()
    try:
        for base in range(0, N + 1, 500):
            futs = []
            for i in range(base, min(N + 1, base + 500)):
                t = T0 + (i * STEP_MS if i < N else 3_600_000)
                key = f"k{i % KEYS}" if i < N else "end"
                e = CloudEvent.create(
                    type="e", source="/agg", id=f"e{i}", time=iso(t), data={"n": i, "key": key}
                )
                headers, value = encode_kafka_binary(e)
                futs.append(await producer.send(topic, value, key=key.encode(), headers=headers))
            await asyncio.gather(*futs)
            done[0] = base + len(futs)
            await asyncio.sleep(0.25)  # paced: the kills land mid-stream
    finally:
        await producer.stop()


async def consuming(drivers: list[Driver]) -> Driver:
    """The driver that owns the one input partition now: the one whose commits go on."""
    for d in drivers:
        await asyncio.to_thread(d.wait_ready)
    before = [d.stats.get("txn_commits", 0) for d in drivers]
    for _ in range(600):
        for d, n in zip(drivers, before):
            if d.stats.get("txn_commits", 0) > n:
                return d
        await asyncio.sleep(0.05)  # polling the drivers' counters (every 0.5 s)
    raise AssertionError(f"no driver commits: {[d.stats for d in drivers]}")


@pytest.mark.timeout(240)
async def test_tumbling_counts_exactly_once_through_kill_9(
    topic_factory: Any, kafka_bootstrap: str, redis_url: str
) -> None:
    import redis.asyncio as aioredis

    topics = (
        topic_factory("ea-in", partitions=1),
        topic_factory("ea-out", partitions=4),
        topic_factory("ea-dlq"),
    )
    name = f"eosa-{uuid.uuid4().hex[:6]}"
    env = {"EOS_AGG": redis_url, "EOS_NAME": name}

    def start() -> Driver:
        return Driver(kafka_bootstrap, topics, f"eosa-{name}", 0.02, extra_env=env)

    drivers = [start() for _ in range(2)]
    everyone = list(drivers)
    try:
        for d in drivers:
            await asyncio.to_thread(d.wait_ready)
        done = [0]
        producing = asyncio.create_task(produce(kafka_bootstrap, topics[0], done))
        kills = 0
        for mark in (0.3, 0.6):  # kill -9 the replica that consumes, start another, twice
            while done[0] < N * mark:
                await asyncio.sleep(0.05)
            victim = await consuming(drivers)
            drivers.remove(victim)
            victim.signal(signal.SIGUSR2)  # SIGKILL at once inside an open transaction
            died = await asyncio.to_thread(victim.wait_dead, 60)
            assert died == -signal.SIGKILL, f"the victim did not die by SIGKILL: {died}"
            kills += 1
            victim.stop()
            drivers.append(start())
            everyone.append(drivers[-1])
        await producing

        want = expected()
        out = await read(kafka_bootstrap, topics[1], "read_committed", len(want), 120)
        note = f"\n-- the drivers' warnings:\n{warnings_of(everyone)}"
        ids = Counter(e.id for e in out)
        assert max(ids.values()) == 1, f"a window emitted twice: {ids.most_common(3)}{note}"
        got = {(e.data["key"], e.data["window_start"]): (e.data["n"], e.data["total"]) for e in out}
        missing = sorted(set(want) - set(got))
        assert not missing, f"{len(missing)} windows missing: {missing[:5]}{note}"
        wrong = {w: (got[w], v) for w, v in want.items() if got[w] != v}
        assert not wrong, (
            f"{len(wrong)} windows counted wrong (got, want): {list(wrong.items())[:5]}{note}"
        )
        assert set(got) == set(want), sorted(set(got) - set(want))[:5]
        # each key's windows in window order (one output partition a key)
        starts: dict[str, list[str]] = defaultdict(list)
        for e in out:  # in each partition's order
            starts[e.data["key"]].append(e.data["window_start"])
        assert all(s == sorted(s) for s in starts.values())
        assert await read(kafka_bootstrap, topics[2], "read_committed", 1, 3) == []
        # the kills left open transactions that were aborted: their records are in the log
        raw = await read(kafka_bootstrap, topics[1], "read_uncommitted", len(want) + 1, 20)
        assert len(raw) > len(want), "no aborted attempt is in the log"
        assert kills == 2
    finally:
        for d in drivers:
            d.stop()
        r = aioredis.Redis.from_url(redis_url)
        await r.delete(*keys.aggregate_keys(name, "per_key"))
        await r.aclose()
