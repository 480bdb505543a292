"""Every emit mode of the join on the real stack through a replica kill -9 and a Redis restart.

Orders (shuffled, spread over 4 partitions) with 0-3 payments each (shuffled across 4
partitions by order id, so one order's payments keep their order), produced once in bulk;
three pipelines, one join step each (``emit: every``, ``first``, ``latest``), consume the same
two topics at the same time, so one kill -9 (of the three replicas at once) and one Redis
restart (append-only file) hit every mode. The orders go first and are all waiting in Redis
before the payments start, so each mode's output is known exactly:

* every, latest: one joined event per payment (its order arrived first);
* first: one joined event per order with a payment, with its first payment.

While the payments flow, the replicas are killed with SIGKILL (30% of the joined events out)
and Redis is restarted (60% out). Each mode must still deliver each expected pair exactly once
(the sink's dedupe drops what a replayed batch emits again) and nothing else, and nothing is
dead-lettered.

Sizing: the suite runs 20,000 orders (~30,000 payments, ~75,000 joined events); the issue's
50,000 orders run with ``EVENTBUS_STATEFUL_FULL=1`` (253 s for this test on the shared 2-core
machine at a load average of 22-40, against 97 s for 20,000 at 20-26: pass ``--timeout=900``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import redis

from eventbus._internal import keys
from tests.integration.bulk_kafka import Record, ce_record, collect_data, produce_bulk
from tests.integration.kafka_helpers import last_offsets
from tests.integration.test_join import replica_pid

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]

#: The issue's 50,000 orders with ``EVENTBUS_STATEFUL_FULL=1``; the suite's time budget pays for
#: 20,000 (see the module's docstring).
ORDERS = 50_000 if os.environ.get("EVENTBUS_STATEFUL_FULL") == "1" else 20_000
PARTITIONS = 4
MODES = ("every", "first", "latest")
STEP = "j"


def doc(name: str, mode: str, orders: str, payments: str, sink: str, dlq: str) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": orders}}, {"kafka": {"topic": payments}}],
            "steps": [
                {
                    "id": STEP,
                    "join": {
                        "emit": mode,
                        "sides": [
                            {"name": "order", "when": "type == 'o'", "key": "data.id"},
                            {"name": "payment", "when": "type == 'p'", "key": "data.id"},
                        ],
                        "window_s": 600,
                        "output": {
                            "type": f"paid.{mode}",
                            "data": "{'o': order.data.id, 'p': payment.data.n}",
                        },
                    },
                }
            ],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "delivery": {"dedupe": {"window_s": 600}},
            "serving": {"replicas": 1, "batch": {"max_size": 2000, "linger_ms": 5}},
        },
    }


def workload(
    seed: int,
) -> tuple[dict[int, list[Record]], dict[int, list[Record]], dict[int, int]]:
    """Shuffled orders round-robin over the partitions; shuffled payments (numbered 1..k per
    order in the order they are sent, one order's on one partition); the payments per order."""
    rnd = random.Random(seed)
    count = {i: rnd.randrange(4) for i in range(ORDERS)}
    ids = list(range(ORDERS))
    rnd.shuffle(ids)
    orders: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    for at, i in enumerate(ids):
        orders[at % PARTITIONS].append(ce_record("o", "/shop", f"o{i}", {"id": i}))
    owners = [i for i, k in count.items() for _ in range(k)]
    rnd.shuffle(owners)
    seen: Counter[int] = Counter()
    payments: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    for i in owners:
        seen[i] += 1
        n = seen[i]
        payments[i % PARTITIONS].append(ce_record("p", "/pay", f"p{i}-{n}", {"id": i, "n": n}))
    return orders, payments, count


def pending(client: redis.Redis, name: str, emit: str) -> int:
    zset = "due" if emit == "first" else "pdue"
    return int(client.zcard(keys.join_prefix(name, STEP) + zset))


def joined(client: redis.Redis, names: list[str]) -> int:
    """The joined events the pipelines' replicas report (their last published stats)."""
    total = 0
    for name in names:
        for raw in client.hgetall(keys.stats(name)).values():
            steps = json.loads(raw).get("metrics", {}).get("steps", {})
            total += int(steps.get(STEP, {}).get("stats", {}).get("joined", 0))
    return total


async def wait_for(check: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.2)


async def test_every_mode_exactly_once_through_a_replica_kill_and_a_redis_restart(
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    redis_server: Any,
    redis_url: str,
) -> None:
    t0 = time.monotonic()
    phases: list[str] = []

    def phase(what: str) -> None:
        phases.append(f"{what} {time.monotonic() - t0:.1f} s")
        print(f"join faults ({ORDERS} orders): {phases[-1]}")

    orders_t = topic_factory("orders", partitions=PARTITIONS)
    payments_t = topic_factory("payments", partitions=PARTITIONS)
    run = uuid.uuid4().hex[:6]
    names = {m: f"join-{m}-{run}" for m in MODES}
    sinks = {m: topic_factory(f"paid-{m}", partitions=PARTITIONS) for m in MODES}
    dlqs = {m: topic_factory(f"paid-{m}-dlq") for m in MODES}
    await asyncio.gather(
        *(
            asyncio.to_thread(
                deploy_pipeline, doc(names[m], m, orders_t, payments_t, sinks[m], dlqs[m])
            )
            for m in MODES
        )
    )
    phase("deployed")
    orders, payments, count = workload(seed=22)
    every = Counter((i, n) for i, k in count.items() for n in range(1, k + 1))
    expected = {
        "every": every,
        "latest": every,
        "first": Counter((i, 1) for i, k in count.items() if k),
    }
    total = sum(sum(c.values()) for c in expected.values())

    client = redis.Redis.from_url(redis_url)
    await produce_bulk(kafka_bootstrap, orders_t, orders)
    phase("orders produced")
    for m in MODES:  # every order waits in Redis: the payments' output is known exactly
        await wait_for(
            lambda m=m: pending(client, names[m], m) == ORDERS, f"{m}: the orders waiting", 120
        )
    phase("orders waiting")
    victims = [await asyncio.to_thread(replica_pid, names[m]) for m in MODES]

    async def faults() -> None:
        pipes = list(names.values())
        await wait_for(lambda: joined(client, pipes) >= total * 0.3, "30% joined", 180)
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        phase("replicas killed")
        await wait_for(lambda: joined(client, pipes) >= total * 0.6, "60% joined", 180)
        phase("redis restart")
        await asyncio.to_thread(redis_server.restart)
        phase("redis restarted")

    await asyncio.gather(produce_bulk(kafka_bootstrap, payments_t, payments), faults())
    phase("payments produced")
    outs = await asyncio.gather(
        *(collect_data(kafka_bootstrap, sinks[m], sum(expected[m].values()), 240) for m in MODES)
    )
    phase("outputs collected")
    for m, out in zip(MODES, outs, strict=True):
        assert len({ce_id for ce_id, _ in out}) == len(out), f"{m}: an output delivered twice"
        got = Counter((d["o"], d["p"]) for _, d in out)
        dups = [pair for pair, c in got.items() if c > 1]
        assert not dups, f"{m}: {len(dups)} pairs twice, e.g. {dups[:3]}"
        missing = expected[m] - got
        assert not missing, f"{m}: {len(missing)} pairs missing, e.g. {list(missing)[:3]}"
        assert got == expected[m], f"{m}: unexpected pairs {list(got - expected[m])[:3]}"
    for m, victim in zip(MODES, victims, strict=True):
        assert await asyncio.to_thread(replica_pid, names[m]) != victim
    dead = await asyncio.gather(*(last_offsets(kafka_bootstrap, dlqs[m]) for m in MODES))
    assert dead == [{}, {}, {}], f"dead-lettered (partition: end offset) per mode: {dead}"
    client.close()
