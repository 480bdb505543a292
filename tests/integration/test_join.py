"""The join step on the real stack: orders and payments joined by order id in Redis.

Outer joins emit partial results at timeout; every pair of a key on the stack, and an event
over ``max_key_bytes`` dead-lettered. The faults are in ``test_join_faults.py``: the issue's
50,000 orders with 0-3 payments each, every emit mode in one pipeline, through a replica
death between the sink's ack and its dedupe marks, a replica kill -9 and a Redis restart (it
took over the 50,000 shuffled pairs through the death after the sink's ack that ran here,
39 s, to pay for its own size). Event time and late events: ``test_join_event_time.py``;
a retried dispatch keeping a partition's order in the join state: ``test_join_order.py``.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from eventbus import CloudEvent
from eventbus.eventing._codecs import encode_kafka_binary
from tests.integration.kafka_helpers import collect

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]


def doc(name: str, orders: str, payments: str, sink: str, dlq: str, **join: Any) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": orders}}, {"kafka": {"topic": payments}}],
            "steps": [
                {
                    "id": "paid",
                    "join": {
                        "sides": [
                            {
                                "name": "order",
                                "when": "type == 'order.created'",
                                "key": "data.order_id",
                            },
                            {
                                "name": "payment",
                                "when": "type == 'payment.created'",
                                "key": "data.order_id",
                            },
                        ],
                        "output": {"type": "order.paid"},
                        **join,
                    },
                }
            ],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "delivery": {"dedupe": {"window_s": 600}},
            "serving": {"replicas": 1, "batch": {"max_size": 2000, "linger_ms": 5}},
        },
    }


def events(n: int, seed: int) -> tuple[list[CloudEvent], list[CloudEvent]]:
    orders = [
        CloudEvent.create(
            type="order.created",
            source="/shop",
            id=f"o{i}",
            data={"order_id": f"ord-{i}", "item": i % 97},
        )
        for i in range(n)
    ]
    payments = [
        CloudEvent.create(
            type="payment.created",
            source="/pay",
            id=f"p{i}",
            data={"order_id": f"ord-{i}", "amount": i * 3},
        )
        for i in range(n)
    ]
    rnd = random.Random(seed)
    rnd.shuffle(orders)
    rnd.shuffle(payments)
    return orders, payments


async def produce(
    bootstrap: str, topic: str, evs: list[CloudEvent], progress: list[int] | None = None
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=256 * 1024
    )
    await producer.start()
    try:
        for base in range(0, len(evs), 2000):
            futs = []
            for e in evs[base : base + 2000]:
                headers, value = encode_kafka_binary(e)
                futs.append(
                    await producer.send(topic, value, headers=headers)
                )  # keyless: spread over partitions
            await asyncio.gather(*futs)
            if progress is not None:
                progress[0] += len(futs)
    finally:
        await producer.stop()


def check_pairs(out: list[CloudEvent], n: int) -> None:
    counts = Counter(e.data["order"]["order_id"] for e in out)
    dups = [k for k, c in counts.items() if c > 1]
    assert not dups, f"{len(dups)} pairs emitted twice, e.g. {dups[:3]}"
    assert len(counts) == n, f"{n - len(counts)} pairs missing"
    for e in out:
        i = int(e.data["order"]["order_id"].split("-")[1])
        assert e.type == "order.paid" and e["partitionkey"] == f"ord-{i}"
        assert e.data == {
            "order": {"order_id": f"ord-{i}", "item": i % 97},
            "payment": {"order_id": f"ord-{i}", "amount": i * 3},
        }


def replica_pid(name: str) -> int:
    from ray import serve

    return int(serve.get_app_handle(f"eventbus-{name}").stats.remote().result(timeout_s=60)["pid"])


async def test_outer_join_emits_partials_at_timeout(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str
) -> None:
    orders_t, payments_t = topic_factory("orders"), topic_factory("payments")
    sink, dlq = topic_factory("paid"), topic_factory("join-dlq")
    name = f"join-outer-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(doc(name, orders_t, payments_t, sink, dlq, mode="outer", window_s=2))
    orders, payments = events(10, seed=1)
    paid_ids = {e.data["order_id"] for e in payments[:6]}
    await produce(kafka_bootstrap, orders_t, orders)
    await produce(
        kafka_bootstrap, payments_t, [p for p in payments if p.data["order_id"] in paid_ids]
    )
    out = await collect(
        kafka_bootstrap, sink, 10, timeout_s=60
    )  # 6 complete at once, 4 partial after ~2 s
    by_order = {e.data["order"]["order_id"]: e for e in out}
    assert len(out) == 10 and set(by_order) == {e.data["order_id"] for e in orders}
    for oid, e in by_order.items():
        if oid in paid_ids:
            assert "payment" in e.data and "_missing" not in e.data
        else:
            assert e.data["_missing"] == ["payment"] and "payment" not in e.data


async def test_every_pair_of_a_key_on_the_stack_and_key_full_to_the_dead_letters(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str
) -> None:
    """emit: every (the default) on a replica with Redis: two orders and two payments of one
    key give four joined events; an event over max_key_bytes is dead-lettered with the reason."""
    orders_t, payments_t = topic_factory("orders"), topic_factory("payments")
    sink, dlq = topic_factory("paid"), topic_factory("join-dlq")
    name = f"join-every-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(doc(name, orders_t, payments_t, sink, dlq, max_key_bytes=2048))

    def one(kind: str, i: int, key: str, pad: int = 0) -> CloudEvent:
        t = "order.created" if kind == "o" else "payment.created"
        return CloudEvent.create(
            type=t,
            source="/shop",
            id=f"{kind}{i}",
            data={"order_id": key, "n": i, "pad": "x" * pad},
        )

    keys = [f"ord-{k}" for k in range(5)]
    await produce(kafka_bootstrap, orders_t, [one("o", i, k) for i in (1, 2) for k in keys])
    await produce(kafka_bootstrap, payments_t, [one("p", i, k) for i in (1, 2) for k in keys])
    await produce(kafka_bootstrap, orders_t, [one("o", 3, "ord-0", pad=3000)])
    out = await collect(kafka_bootstrap, sink, 20, timeout_s=60)
    got = Counter(
        (e.data["order"]["order_id"], e.data["order"]["n"], e.data["payment"]["n"]) for e in out
    )
    assert got == Counter({(k, o, p): 1 for k in keys for o in (1, 2) for p in (1, 2)})
    [dead] = await collect(kafka_bootstrap, dlq, 1, timeout_s=30)
    assert dead.id == "o3" and dead["eberrortype"] == "JoinKeyFullError"
    assert "max_key_bytes is 2048" in dead["eberror"]
