"""Real offset gaps on Apache Kafka: a transactional producer's input topic (every fifth
transaction aborted) and a compacted input topic.

Transaction markers take an offset each, aborted records are skipped by ``read_committed``,
compaction removes records: a partition's offsets have gaps that never fill. The source must
take every committed record once, no aborted one, and never hold a partition at a gap
(``gap_holds`` stays 0: the Tansu-only gap wait is off on Apache Kafka).
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from tests.integration.test_kafka_source import (
    decode_record,
    make_source,
    read_all,
    run_until_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.kafka_only]

TRANSACTIONS = 40
PER_TRANSACTION = 50


async def passthrough(events: list[CloudEvent]) -> list[Outcome]:
    return [[e.replace(id=e.id + "-out")] for e in events]


async def test_aborted_transactions_never_reach_a_step_and_markers_stall_nothing(
    kafka_bootstrap: str, topic_factory, request
) -> None:
    src = topic_factory("txin", partitions=2)
    out = topic_factory("txout", partitions=2)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"tx-{src}", acks="all"
    )
    await producer.start()
    committed: list[int] = []
    try:
        n = 0
        for t in range(TRANSACTIONS):
            await producer.begin_transaction()
            batch = []
            for _ in range(PER_TRANSACTION):
                key = f"k{n % 5}".encode()
                batch.append(n)
                await producer.send(src, orjson.dumps({"n": n, "t": t}), key=key)
                n += 1
            if t % 5 == 4:  # every fifth transaction is aborted
                await producer.abort_transaction()
            else:
                await producer.commit_transaction()
                committed += batch
    finally:
        await producer.stop()

    seen: list[int] = []

    async def record(events: list[CloudEvent]) -> list[Outcome]:
        seen.extend(e.data["n"] for e in events)
        return await passthrough(events)

    source = make_source(kafka_bootstrap, src, record, out, None, pipeline=f"p-{src}")
    # offsets: every record, plus one marker per transaction; committed() counts records whose
    # offsets were committed, which is the committed records here (aborted ones never arrive)
    await run_until_committed(source, len(committed))
    stats = source.stats()
    assert sorted(seen) == sorted(committed)  # no aborted record reached the step, none lost
    assert stats["gap_holds"] == 0
    got = await read_all(kafka_bootstrap, out, len(committed))
    ns = [decode_record(r).data["n"] for r in got]
    assert sorted(ns) == sorted(committed)
    by_key: dict[bytes, list[int]] = {}
    for r, v in zip(got, ns, strict=True):
        by_key.setdefault(r.key, []).append(v)
    for key, seq in by_key.items():
        assert seq == sorted(seq), f"order broken for key {key!r}"


async def test_a_compacted_input_topic_is_read_without_stalls(kafka_bootstrap: str, topic_factory):
    name = f"compacted-{topic_factory('x')}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        # compaction as soon as a segment rolls (every 100 ms of writes)
        await admin.create_topics(
            [
                NewTopic(
                    name,
                    1,
                    1,
                    topic_configs={
                        "cleanup.policy": "compact",
                        "min.cleanable.dirty.ratio": "0.01",
                        "segment.ms": "100",
                        "min.compaction.lag.ms": "0",
                        "delete.retention.ms": "100",
                    },
                )
            ]
        )
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        for rnd in range(30):  # 30 rounds over 20 keys: the older rounds compact away
            for k in range(20):
                await producer.send_and_wait(
                    name, orjson.dumps({"k": k, "round": rnd}), key=f"k{k}".encode()
                )
    finally:
        await producer.stop()
    # wait until the log cleaner removed records: the topic's offsets have real gaps
    from aiokafka import AIOKafkaConsumer, TopicPartition

    tp = TopicPartition(name, 0)
    reader = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
    await reader.start()
    try:
        reader.assign([tp])
        end = (await reader.end_offsets([tp]))[tp]
        deadline = asyncio.get_running_loop().time() + 90
        kept = end
        while kept >= end:
            assert asyncio.get_running_loop().time() < deadline, "the log cleaner never ran"
            await reader.seek_to_beginning(tp)
            kept = 0
            while True:
                batch = await reader.getmany(tp, timeout_ms=500)
                kept += len(batch.get(tp, ()))
                if not batch or reader.highwater(tp) == await reader.position(tp):
                    break
            if kept >= end:
                await asyncio.sleep(0.5)  # the cleaner runs on its own schedule: look again
    finally:
        await reader.stop()

    seen: list[tuple[int, int]] = []

    async def record(events: list[CloudEvent]) -> list[Outcome]:
        seen.extend((e.data["k"], e.data["round"]) for e in events)
        return [[] for _ in events]

    source = make_source(kafka_bootstrap, name, record, f"{name}-out", None, pipeline=f"p-{name}")
    await source.start()
    runner = asyncio.create_task(source.run())
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while not any(r == 29 for _, r in seen) or len({k for k, r in seen if r == 29}) < 20:
            assert asyncio.get_running_loop().time() < deadline, f"saw {len(seen)}: {seen[-5:]}"
            await asyncio.sleep(0.05)
    finally:
        await source.stop()
        await runner
    assert {k for k, r in seen if r == 29} == set(range(20))  # every key's latest value
    assert len(seen) < 20 * 30  # compaction removed records: the offsets had gaps
    assert source.stats()["gap_holds"] == 0
