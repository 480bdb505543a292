"""A join on event time on the real stack: the watermark is kept per source partition.

Orders on two partitions, payments on one (three lanes). Once partition 0 of the orders runs
ten minutes ahead, a payment of partition-1-time still joins (one watermark for the step
would have made it late); when every lane moved on, the windows the watermark passed close
(outer: their partials are emitted) and an event behind it goes to the dead-letter topic with
the reason. The sources run in the replica (the default placement), which decodes the
records in dispatch to know each one's partition.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from eventbus import CloudEvent
from eventbus._internal import keys
from eventbus.eventing._codecs import encode_kafka_binary
from tests.integration.kafka_helpers import collect

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

T = "2024-05-01T12:{:02d}:{:02d}Z"


def doc(name: str, orders: str, payments: str, sink: str, dlq: str, placement: str) -> Any:
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
                        "mode": "outer",
                        "time": "event",
                        "window_s": 60,
                        "allowed_lateness_s": 5,
                        "watermark_idle_s": 300,
                        "sides": [
                            {"name": "order", "when": "type == 'o'", "key": "data.id"},
                            {"name": "payment", "when": "type == 'p'", "key": "data.id"},
                        ],
                    },
                }
            ],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "serving": {
                "replicas": 1,
                "source_placement": placement,
                "batch": {"max_size": 100, "linger_ms": 5},
            },
        },
    }


def ev(kind: str, key: str, minute: int, second: int = 0) -> CloudEvent:
    return CloudEvent.create(
        type=kind,
        source="/shop",
        id=f"{kind}-{key}",
        data={"id": key},
        time=T.format(minute, second),
    )


async def send(bootstrap: str, to: list[tuple[str, int, CloudEvent]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for topic, partition, e in to:
            headers, value = encode_kafka_binary(e)
            await (await producer.send(topic, value, headers=headers, partition=partition))
    finally:
        await producer.stop()


def lanes(redis_url: str, name: str) -> dict[str, str]:
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        return dict(client.hgetall(keys.join_prefix(name, "paid") + "wm"))
    finally:
        client.close()


async def wait_lane(redis_url: str, name: str, lane: str, minute: int) -> None:
    """Until the step merged an event of ``lane`` at 12:<minute> or later."""
    want = int(datetime(2024, 5, 1, 12, minute, tzinfo=UTC).timestamp() * 1000)
    deadline = time.monotonic() + 60
    while True:
        got = (await asyncio.to_thread(lanes, redis_url, name)).get(lane)
        if got is not None and int(got.split(",")[0]) >= want:
            return
        assert time.monotonic() < deadline, f"lane {lane} never reached 12:{minute:02d}: {got}"
        await asyncio.sleep(0.1)


async def test_watermark_per_partition_closes_windows_and_dead_letters_late_events(
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    redis_url: str,
) -> None:
    orders, payments = topic_factory("orders", partitions=2), topic_factory("payments")
    sink, dlq = topic_factory("paid"), topic_factory("dlq")
    name = f"join-et-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(doc(name, orders, payments, sink, dlq, "replica"))
    o0, o1, p0 = f"{orders}[0]", f"{orders}[1]", f"{payments}[0]"

    # every lane at 12:00
    await send(
        kafka_bootstrap,
        [
            (orders, 0, ev("o", "a", 0)),
            (orders, 1, ev("o", "b", 0)),
            (payments, 0, ev("p", "x", 0)),
        ],
    )
    for lane in (o0, o1, p0):
        await wait_lane(redis_url, name, lane, 0)
    # orders' partition 0 runs ten minutes ahead
    await send(kafka_bootstrap, [(orders, 0, ev("o", "c", 10))])
    await wait_lane(redis_url, name, o0, 10)
    # the watermark is the slowest lane's 12:00: a payment of 12:00:30 is on time and joins b
    await send(kafka_bootstrap, [(payments, 0, ev("p", "b", 0, 30))])
    [joined] = await collect(kafka_bootstrap, sink, 1, timeout_s=60)
    assert joined.data == {"order": {"id": "b"}, "payment": {"id": "b"}}

    # every lane moves to 12:20: windows a, x (12:00) and c (12:10) close with partials
    await send(
        kafka_bootstrap,
        [
            (orders, 0, ev("o", "z0", 20)),
            (orders, 1, ev("o", "z1", 20)),
            (payments, 0, ev("p", "z2", 20)),
        ],
    )
    out = await collect(kafka_bootstrap, sink, 4, timeout_s=60)
    partials = sorted(
        (next(iter(k for k in e.data if k != "_missing")), e.data["_missing"]) for e in out[1:]
    )
    assert len(out) == 4
    assert partials == [("order", ["payment"]), ("order", ["payment"]), ("payment", ["order"])]
    assert {e.data[s]["id"] for e in out[1:] for s in ("order", "payment") if s in e.data} == {
        "a",
        "c",
        "x",
    }

    # 12:05 + 60 s + 5 s is behind the watermark (12:20): late, dead-lettered with the reason
    await send(kafka_bootstrap, [(orders, 1, ev("o", "late", 5))])
    [dead] = await collect(kafka_bootstrap, dlq, 1, timeout_s=60)
    assert dead.id == "o-late" and dead["eberrortype"] == "LateEventError"
    assert (
        "join key 'late': event time 2024-05-01T12:05:00Z is late: 900.0 s behind"
        in dead["eberror"]
    )
    assert "the watermark 2024-05-01T12:20:00Z" in dead["eberror"]
