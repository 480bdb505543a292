"""Bulk CloudEvents on the real broker for the large stateful tests (join, aggregate).

Records are built as Kafka binary-mode CloudEvents directly (headers and an orjson value, as
:func:`eventbus.eventing._codecs.encode_kafka_binary` writes them), produced per partition in
record batches (as ``benchmarks/_common.py`` produces), and read back without building a
:class:`~eventbus.CloudEvent` per record: 100,000s of events in seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from tests.integration.kafka_helpers import reader_gaps

#: One record: its headers and its value.
Record = tuple[list[tuple[str, bytes]], bytes]


def ce_record(type_: str, source: str, id_: str, data: Any, time_: str | None = None) -> Record:
    """A binary-mode CloudEvent record with JSON data."""
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", id_.encode()),
        ("ce_source", source.encode()),
        ("ce_type", type_.encode()),
    ]
    if time_ is not None:
        headers.append(("ce_time", time_.encode()))
    headers.append(("content-type", b"application/json"))
    return headers, orjson.dumps(data)


async def produce_bulk(bootstrap: str, topic: str, parts: dict[int, list[Record]]) -> None:
    """Produce each partition's records in record batches, the partitions at once; a
    partition's next batch goes once its last one is acknowledged, so the broker stores them
    in order (a tests' premise: one order's payments in the order they were made)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=512 * 1024
    )

    async def one(part: int, records: list[Record]) -> None:
        batch = producer.create_batch()
        for headers, value in records:
            if batch.append(key=None, value=value, timestamp=None, headers=headers) is None:
                await (await producer.send_batch(batch, topic, partition=part))
                batch = producer.create_batch()
                batch.append(key=None, value=value, timestamp=None, headers=headers)
        if batch.record_count():
            await (await producer.send_batch(batch, topic, partition=part))

    await producer.start()
    try:
        await asyncio.gather(*(one(part, records) for part, records in parts.items()))
    finally:
        await producer.stop()


async def collect_data(
    bootstrap: str, topic: str, count: int, timeout_s: float
) -> list[tuple[bytes, Any]]:
    """Read ``topic`` from the beginning until ``count`` records came (then 0.5 s more to catch
    extras): each record's ``ce_id`` and its data (JSON-decoded)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    gaps = reader_gaps()
    out: list[tuple[bytes, Any]] = []
    deadline = time.monotonic() + timeout_s
    extra_until: float | None = None
    try:
        while time.monotonic() < deadline:
            if extra_until is not None and time.monotonic() > extra_until:
                break
            fetched = await consumer.getmany(timeout_ms=200, max_records=20_000)
            batch, _ = gaps.take(consumer, fetched, time.monotonic())
            for records in batch.values():
                for r in records:
                    ce_id = next(v for k, v in r.headers if k == "ce_id")
                    out.append((ce_id, orjson.loads(r.value)))
            if len(out) >= count and extra_until is None:
                extra_until = time.monotonic() + 0.5
    finally:
        await consumer.stop()
    return out
