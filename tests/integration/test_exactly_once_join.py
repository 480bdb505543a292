"""``delivery: {guarantee: exactly_once}`` through a join, on the three-node Apache Kafka
cluster: 100,000 events through convert + join on event time (state in Redis; windows
of 600 s, longer than the input's 100 s of event time) + convert while two replicas'
Kafka paths (``eos_driver`` processes) consume; one is killed with SIGKILL inside an open
transaction and replaced, three times. A ``read_committed`` reader gets every expected joined
event and dead letter exactly once, in per-key order; a ``read_uncommitted`` reader sees the
aborted attempts too.

The join pairs event ``n`` with ``n + 40`` (same Kafka key, so ``n`` is consumed first) for
even ``n // 40``; the joined event is emitted by ``n + 40``'s batch, keyed by its key and
carrying its seq. A kill aborts the open transaction after the join state took its events:
the batches consumed again find their events stored and re-emit the same joined events (same
ids), inside the next owner's transaction.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter
from typing import Any

import pytest

from tests.integration.eos_harness import Driver, read, warnings_of
from tests.integration.eos_harness import produce as produce_events
from tests.integration.test_faults import check_exactly_once_in_key_order

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.kafka_only,
    pytest.mark.redis,
    pytest.mark.slow,
]

N = 100_000


def expected_pairs(n: int) -> set[int]:
    """The ``b`` (``n + 40``) of every pair that must be joined: neither side failed the
    convert (``i % 50 == 0``: dead-lettered)."""
    return {a + 40 for a in range(n - 40) if (a // 40) % 2 == 0 and a % 50 and (a + 40) % 50}


@pytest.mark.timeout(420)
async def test_join_exactly_once_through_kill_9_on_three_brokers(
    kafka_cluster3: Any, redis_url: str
) -> None:
    from tests.integration.broker_faults import forget_state
    from tests.integration.kafka3 import cluster_healthy, create_topics, placement

    cluster = kafka_cluster3
    await cluster_healthy(cluster)
    boot = cluster.bootstrap
    tag = uuid.uuid4().hex[:6]
    topics = (f"ej-in-{tag}", f"ej-out-{tag}", f"ej-dlq-{tag}")
    spread = placement({p: 1 + p % 3 for p in range(4)})
    await create_topics(boot, {topics[0]: spread, topics[1]: spread, topics[2]: placement({0: 1})})
    name = f"eosj-{tag}"
    env = {"EOS_JOIN": redis_url, "EOS_NAME": name}
    group = f"eosj-{tag}"

    def start() -> Driver:
        return Driver(boot, topics, group, 0.02, extra_env=env)

    drivers = [start() for _ in range(2)]
    everyone = list(drivers)
    try:
        for d in drivers:
            await asyncio.to_thread(d.wait_ready)
        done = [0]
        producing = asyncio.create_task(produce_events(boot, topics[0], N, 20.0, done))
        for mark in (0.2, 0.45, 0.7):  # kill -9 one replica, start another, three times
            while done[0] < N * mark:
                await asyncio.sleep(0.05)
            victim = drivers.pop(0)
            await asyncio.to_thread(victim.wait_ready)  # its SIGUSR2 handler is installed
            # it kills itself (SIGKILL) at the first moment an open transaction holds sent
            # batches: the join state took them, their transaction aborts
            victim.signal(signal.SIGUSR2)
            died = await asyncio.to_thread(victim.wait_dead, 60)
            assert died == -signal.SIGKILL, f"the victim did not die by SIGKILL: {died}"
            victim.stop()
            drivers.append(start())
            everyone.append(drivers[-1])
        await producing

        want = expected_pairs(N)
        out = await read(boot, topics[1], "read_committed", len(want), 180)
        seen = Counter(e.data["b"] for e in out)
        missing = sorted(want - set(seen))
        note = f"\n-- the drivers' warnings:\n{warnings_of(everyone)}"
        assert not missing, f"missing {len(missing)} joined events: {missing[:10]}{note}"
        assert set(seen) == want, f"unexpected: {sorted(set(seen) - want)[:10]}"
        assert max(seen.values()) == 1, f"joined twice: {seen.most_common(3)}{note}"
        # same ids once each, and each key's joined events in its seq order
        check_exactly_once_in_key_order(out, {e.id for e in out})
        assert len(out) == len(want)
        assert all(e.data["a"] + 40 == e.data["b"] for e in out)
        dead = await read(boot, topics[2], "read_committed", N // 50, 60)
        counts = Counter(e.id for e in dead)
        assert set(counts) == {f"e{i}" for i in range(0, N, 50)}, len(counts)
        assert max(counts.values()) == 1, counts.most_common(3)
        # the kills left open transactions that were aborted: their records are in the log
        raw = await read(boot, topics[1], "read_uncommitted", len(want) + 1, 20)
        assert len(raw) > len(want), "no aborted attempt is in the log"
    finally:
        for d in drivers:
            d.stop()
        await forget_state(redis_url, [name])
        await cluster_healthy(cluster)  # the next test gets three nodes
