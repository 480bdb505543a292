"""``delivery: {guarantee: exactly_once}`` through a join, on the three-node Apache Kafka
cluster: 100,000 events through convert + join on event time (state in Redis; windows
of 600 s, longer than the input's 100 s of event time) + convert while replicas' Kafka
paths (``eos_driver`` processes) consume through every fault of ``eos_faults3``: kill -9
inside an open transaction (twice), the kill of output partition 0's leader, the restart of
the group coordinator's broker, scale 1 -> 3 -> 1. A ``read_committed`` reader gets every
expected joined event and dead letter exactly once, in per-key order; a ``read_uncommitted``
reader sees the aborted attempts too.

The join pairs event ``n`` with ``n + 40`` (same Kafka key, so ``n`` is consumed first) for
even ``n // 40``; the joined event is emitted by ``n + 40``'s batch, keyed by its key and
carrying its seq. A kill aborts the open transaction after the join state took its events:
the batches consumed again find their events stored and re-emit the same joined events (same
ids), inside the next owner's transaction.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest

from tests.integration.eos_harness import read, warnings_of
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
async def test_join_exactly_once_through_every_fault_on_three_brokers(
    kafka_cluster3: Any, redis_url: str
) -> None:
    from tests.integration.broker_faults import forget_state
    from tests.integration.eos_faults3 import every_fault

    name = f"eosj-{uuid.uuid4().hex[:6]}"
    env = {"EOS_JOIN": redis_url, "EOS_NAME": name}
    try:
        async with every_fault(kafka_cluster3, "ej", N, env) as run:
            boot, (_, sink, dlq) = run.bootstrap, run.topics
            want = expected_pairs(N)
            out = await read(boot, sink, "read_committed", len(want), 180)
            seen = Counter(e.data["b"] for e in out)
            missing = sorted(want - set(seen))
            note = f"\n-- the drivers' warnings:\n{warnings_of(run.everyone)}"
            assert not missing, f"missing {len(missing)} joined events: {missing[:10]}{note}"
            assert set(seen) == want, f"unexpected: {sorted(set(seen) - want)[:10]}"
            assert max(seen.values()) == 1, f"joined twice: {seen.most_common(3)}{note}"
            # same ids once each, and each key's joined events in its seq order
            check_exactly_once_in_key_order(out, {e.id for e in out})
            assert len(out) == len(want)
            assert all(e.data["a"] + 40 == e.data["b"] for e in out)
            dead = await read(boot, dlq, "read_committed", N // 50, 60)
            counts = Counter(e.id for e in dead)
            assert set(counts) == {f"e{i}" for i in range(0, N, 50)}, len(counts)
            assert max(counts.values()) == 1, counts.most_common(3)
            # the kills left open transactions that were aborted: their records are in the log
            raw = await read(boot, sink, "read_uncommitted", len(want) + 1, 20)
            assert len(raw) > len(want), "no aborted attempt is in the log"
    finally:
        await forget_state(redis_url, [name])
