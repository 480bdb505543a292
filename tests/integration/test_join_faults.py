"""Every emit mode of the join on the real stack through a replica kill -9 and a Redis restart.

Per mode, 10,000 orders (shuffled, spread over 4 partitions) with 0-3 payments each (shuffled
across 4 partitions by order id, so one order's payments keep their order). One pipeline runs
three join steps, one per ``emit`` mode, each on its own copy of the events (types
``o.<mode>``/``p.<mode>``; a step passes the other steps' events through), so one deploy and
one fault hit all three modes. The orders go first and are all waiting in Redis before the
payments start, so each mode's output is known exactly:

* every, latest: one joined event per payment (its order arrived first);
* first: one joined event per order with a payment, with its first payment.

While the payments flow, the replica is killed with SIGKILL (30% in) and Redis is restarted
from its append-only file (60% in). Each mode must still deliver each expected pair exactly
once (the sink's dedupe drops what a replayed batch emits again) and nothing else.

Sized to prove the property in ~40 s on a loaded 2-core machine: 75,000 events, three modes,
two faults; ``tests/integration/test_join.py`` runs 50,000 pairs of the default mode.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from eventbus import CloudEvent
from eventbus._internal import keys
from tests.integration.kafka_helpers import collect, produce
from tests.integration.test_join import replica_pid

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]

ORDERS = 10_000
MODES = ("every", "first", "latest")


def doc(name: str, orders: str, payments: str, sink: str, dlq: str) -> dict[str, Any]:
    steps = [
        {
            "id": f"j_{m}",
            "join": {
                "emit": m,
                "sides": [
                    {"name": "order", "when": f"type == 'o.{m}'", "key": "data.id"},
                    {"name": "payment", "when": f"type == 'p.{m}'", "key": "data.id"},
                ],
                "window_s": 600,
                "output": {
                    "type": f"paid.{m}",
                    "data": "{'o': order.data.id, 'p': payment.data.n}",
                },
            },
        }
        for m in MODES
    ]
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": orders}}, {"kafka": {"topic": payments}}],
            "steps": steps,
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "delivery": {"dedupe": {"window_s": 600}},
            "serving": {"replicas": 1, "batch": {"max_size": 2000, "linger_ms": 5}},
        },
    }


def workload(seed: int) -> tuple[list[CloudEvent], list[CloudEvent], dict[int, int]]:
    """Shuffled orders; shuffled payments (numbered 1..k per order in the order they are
    sent); the payment count per order."""
    rnd = random.Random(seed)
    count = {i: rnd.randrange(4) for i in range(ORDERS)}
    orders = [
        CloudEvent.create(type=f"o.{m}", source="/shop", id=f"o{i}.{m}", data={"id": i})
        for i in range(ORDERS)
        for m in MODES
    ]
    rnd.shuffle(orders)
    owners = [i for i, k in count.items() for _ in range(k)]
    rnd.shuffle(owners)
    seen: Counter[int] = Counter()
    payments = []
    for i in owners:
        seen[i] += 1
        payments += [
            CloudEvent.create(
                type=f"p.{m}",
                source="/pay",
                id=f"p{i}-{seen[i]}.{m}",
                data={"id": i, "n": seen[i]},
                partitionkey=str(i),  # one order's payments on one partition, in order
            )
            for m in MODES
        ]
    return orders, payments, count


def pending(redis_url: str, name: str, emit: str) -> int:
    import redis

    zset = "due" if emit == "first" else "pdue"
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.zcard(keys.join_prefix(name, f"j_{emit}") + zset))
    finally:
        client.close()


async def wait_for(check: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_every_mode_exactly_once_through_a_replica_kill_and_a_redis_restart(
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    redis_server: Any,
    redis_url: str,
) -> None:
    orders_t = topic_factory("orders", partitions=4)
    payments_t = topic_factory("payments", partitions=4)
    sink, dlq = topic_factory("paid", partitions=4), topic_factory("dlq")
    name = f"join-faults-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(doc(name, orders_t, payments_t, sink, dlq))
    orders, payments, count = workload(seed=22)
    await produce(kafka_bootstrap, orders_t, orders)
    for m in MODES:  # every order waits in Redis: the payments' output is known exactly
        await wait_for(lambda m=m: pending(redis_url, name, m) == ORDERS, f"{m}: orders", 120)
    victim = await asyncio.to_thread(replica_pid, name)

    third = len(payments) * 3 // 10
    await produce(kafka_bootstrap, payments_t, payments[:third])
    os.kill(victim, signal.SIGKILL)
    await produce(kafka_bootstrap, payments_t, payments[third : 2 * third])
    await asyncio.to_thread(redis_server.restart)
    await produce(kafka_bootstrap, payments_t, payments[2 * third :])

    every = Counter((i, n) for i, k in count.items() for n in range(1, k + 1))
    expected = {
        "every": every,
        "latest": every,
        "first": Counter((i, 1) for i, k in count.items() if k),
    }
    total = sum(sum(c.values()) for c in expected.values())
    out = await collect(kafka_bootstrap, sink, total, timeout_s=180)
    assert len({e.id for e in out}) == len(out), "an output delivered twice"
    for m in MODES:
        got = Counter((e.data["o"], e.data["p"]) for e in out if e.type == f"paid.{m}")
        dups = [pair for pair, c in got.items() if c > 1]
        assert not dups, f"{m}: {len(dups)} pairs twice, e.g. {dups[:3]}"
        missing = expected[m] - got
        assert not missing, f"{m}: {len(missing)} pairs missing, e.g. {list(missing)[:3]}"
        assert got == expected[m], f"{m}: unexpected pairs {list(got - expected[m])[:3]}"
    assert len(out) == total
    assert await asyncio.to_thread(replica_pid, name) != victim
