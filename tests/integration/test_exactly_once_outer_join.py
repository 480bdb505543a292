"""``delivery: {guarantee: exactly_once}`` through an outer join on Apache Kafka: 12,000
events with event times 5 ms apart (one input partition), paired per key over one-second
windows, a third of the keys left with one side (emitted when the watermark closes their
window), while a replica's Kafka path (``eos_driver``, ``EOS_OUTER``) is killed with SIGKILL
inside an open transaction, twice, and replaced (and, lighter, with ``emit: first``). The consumed events close the windows inside
their batch's transaction; a batch consumed again re-emits what it emitted. A
``read_committed`` reader sees every joined pair and every unmatched event exactly once; a
``read_uncommitted`` reader sees the aborted attempts too.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from eventbus import CloudEvent
from eventbus.eventing._codecs import encode_kafka_binary
from tests.integration.broker_faults import forget_state
from tests.integration.eos_harness import Driver, read, warnings_of
from tests.integration.test_exactly_once_aggregate import consuming

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]

N = 12_000
STEP_MS = 5
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000


@pytest.fixture(autouse=True)
def _apache_kafka_only(broker_kind: str) -> None:
    if broker_kind != "kafka":
        pytest.skip("Tansu delivers aborted transactions' records to read_committed readers")


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def expected(n_events: int) -> Counter[tuple[int, int]]:
    """(a's n, b's n) of every output, -1 for a missing side (see ``outer_join_pipeline``)."""
    out: Counter[tuple[int, int]] = Counter()
    for g in range(n_events // 2):
        if g % 3 == 0:
            out[(2 * g, -1)] += 1
            out[(-1, 2 * g + 1)] += 1
        else:
            out[(2 * g, 2 * g + 1)] += 1
    return out


async def produce(bootstrap: str, topic: str, done: list[int], n_events: int = N) -> None:
    """Events 0..n_events-1, then one far ahead in event time that closes the last windows."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)
    await producer.start()
    try:
        for base in range(0, n_events + 1, 500):
            futs = []
            for i in range(base, min(n_events + 1, base + 500)):
                t = T0 + (i * STEP_MS if i < n_events else 3_600_000)
                n = i if i < n_events else 10 * n_events  # the last: side a of a key of its own
                e = CloudEvent.create(
                    type="e", source="/oj", id=f"e{i}", time=iso(t), data={"n": n}
                )
                headers, value = encode_kafka_binary(e)
                futs.append(await producer.send(topic, value, key=b"k", headers=headers))
            await asyncio.gather(*futs)
            done[0] = base + len(futs)
            await asyncio.sleep(0.25)  # paced: the kills land mid-stream
    finally:
        await producer.stop()


def pair(e: CloudEvent) -> tuple[int, int]:
    return (e.data["a"]["n"] if "a" in e.data else -1, e.data["b"]["n"] if "b" in e.data else -1)


@pytest.mark.timeout(240)
# emit: first takes the same path (the windows of every event, closed by the batches): a
# lighter run, one kill
@pytest.mark.parametrize(
    ("emit", "n_events", "marks"), [("every", N, (0.3, 0.6)), ("first", N // 3, (0.5,))]
)
async def test_outer_join_pairs_and_unmatched_exactly_once_through_kill_9(
    topic_factory: Any,
    kafka_bootstrap: str,
    redis_url: str,
    emit: str,
    n_events: int,
    marks: tuple[float, ...],
) -> None:
    topics = (
        topic_factory("eo-in", partitions=1),
        topic_factory("eo-out", partitions=4),
        topic_factory("eo-dlq"),
    )
    name = f"eoso-{uuid.uuid4().hex[:6]}"
    env = {"EOS_OUTER": redis_url, "EOS_NAME": name, "EOS_EMIT": emit}

    def start() -> Driver:
        return Driver(kafka_bootstrap, topics, f"eoso-{name}", 0.02, extra_env=env)

    drivers = [start() for _ in range(2)]
    everyone = list(drivers)
    try:
        for d in drivers:
            await asyncio.to_thread(d.wait_ready)
        done = [0]
        producing = asyncio.create_task(produce(kafka_bootstrap, topics[0], done, n_events))
        for mark in marks:  # kill -9 the replica that consumes, start another (each mark)
            while done[0] < n_events * mark:
                await asyncio.sleep(0.05)
            victim = await consuming(drivers)
            drivers.remove(victim)
            victim.signal(signal.SIGUSR2)  # SIGKILL at once inside an open transaction
            died = await asyncio.to_thread(victim.wait_dead, 60)
            assert died == -signal.SIGKILL, f"the victim did not die by SIGKILL: {died}"
            victim.stop()
            drivers.append(start())
            everyone.append(drivers[-1])
        await producing

        want = expected(n_events)
        total = sum(want.values())
        out = await read(kafka_bootstrap, topics[1], "read_committed", total, 120)
        note = f"\n-- the drivers' warnings:\n{warnings_of(everyone)}"
        ids = Counter(e.id for e in out)
        assert max(ids.values()) == 1, f"an output emitted twice: {ids.most_common(3)}{note}"
        got = Counter(pair(e) for e in out)
        missing = sorted((want - got).elements())
        assert not missing, f"{len(missing)} outputs missing: {missing[:5]}{note}"
        assert got == want, sorted((got - want).elements())[:5]
        unmatched = sum(n for p, n in want.items() if -1 in p)
        assert (
            sum("_missing" in e.data for e in out)
            == unmatched
            == 2 * len(range(0, n_events // 2, 3))
        )
        assert await read(kafka_bootstrap, topics[2], "read_committed", 1, 3) == []
        # the kills left open transactions that were aborted: their records are in the log
        raw = await read(kafka_bootstrap, topics[1], "read_uncommitted", total + 1, 20)
        assert len(raw) > total, "no aborted attempt is in the log"
    finally:
        for d in drivers:
            d.stop()
        await forget_state(redis_url, [name])
