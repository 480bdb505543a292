"""KafkaSource and KafkaSink against a real Kafka-protocol broker (Tansu)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from eventbus.eventing._codecs import decode_kafka, encode_kafka_binary, encode_kafka_structured
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure, Outcome
from eventbus.eventing.sinks import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources import (
    DECODE_ERROR_TYPE,
    DeliveryPolicy,
    FetchSettings,
    KafkaSource,
    KafkaSourceConfig,
    SourceSinks,
)
from tests.integration.kafka_helpers import reader_gaps

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

Record = tuple[
    int, bytes | None, bytes | None, list[tuple[str, bytes]]
]  # partition, key, value, headers


async def produce(bootstrap: str, topic: str, records: Sequence[Record]) -> dict[int, int]:
    """Write records to explicit partitions with send_batch; return records per partition."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_batch_size=1 << 20, max_request_size=2 << 20
    )
    await producer.start()
    try:
        by_partition: dict[int, list[Record]] = defaultdict(list)
        for r in records:
            by_partition[r[0]].append(r)
        futures = []
        for partition, recs in by_partition.items():
            batch = producer.create_batch()
            for _, key, value, headers in recs:
                if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    batch.close()
                    futures.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = producer.create_batch()
                    assert batch.append(key=key, value=value, timestamp=None, headers=headers)
            batch.close()
            futures.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*futures)
        return {p: len(rs) for p, rs in by_partition.items()}
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 20.0) -> list[Any]:
    """Read a topic from the beginning until ``expected`` records came, then 0.3 s more."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        if not partitions:
            partitions = sorted(await _partitions(consumer, topic))
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        await consumer.seek_to_beginning()
        gaps = reader_gaps()
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        quiet_until = None
        while time.monotonic() < deadline:
            batch, _ = gaps.take(consumer, await consumer.getmany(timeout_ms=100), time.monotonic())
            for recs in batch.values():
                out.extend(recs)
            if len(out) >= expected:
                if batch or quiet_until is None:
                    quiet_until = time.monotonic() + 0.3
                elif time.monotonic() > quiet_until:
                    break
        return out
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    """The topic's partitions, through a subscription (Apache Kafka answers the consumer's
    bootstrap metadata with no topics; its subscription asks for this one)."""
    deadline = time.monotonic() + 5
    consumer.subscribe([topic])
    try:
        while time.monotonic() < deadline:
            await consumer.getmany(timeout_ms=50)  # the subscription's metadata arrives
            found = consumer.partitions_for_topic(topic)
            if found:
                return set(found)
    finally:
        consumer.unsubscribe()
    raise AssertionError(f"topic {topic} has no partitions")


async def wait_for(
    condition: Callable[[], bool], timeout_s: float, what: Callable[[], str]
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what()}")
        await asyncio.sleep(0.01)


async def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: int
) -> dict[int, int | None]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        await consumer.stop()


def decode_record(r: Any) -> CloudEvent:
    return decode_kafka(
        r.value,
        r.headers,
        key=r.key,
        topic=r.topic,
        partition=r.partition,
        offset=r.offset,
        default_type="plain",
        default_source="test",
    )


async def run_until_committed(source: KafkaSource, n: int) -> None:
    """Run ``source`` until ``n`` records are committed (30 s deadline), then stop it."""
    await source.start()
    runner = asyncio.create_task(source.run())
    try:
        await wait_for(lambda: source.stats()["committed"] >= n, 30, lambda: str(source.stats()))
    finally:
        await source.stop()
        await runner


def make_source(
    bootstrap: str,
    topic: str,
    dispatch: Callable[[list[CloudEvent]], Awaitable[list[Outcome]]],
    out_topic: str,
    dlq_topic: str | None,
    *,
    pipeline: str,
    group: str | None = None,
    fetch: dict[str, Any] | None = None,
    **delivery: Any,
) -> KafkaSource:
    """A source with a quick group join and quick retries; ``fetch`` and ``delivery`` (retry,
    dedupe) override :class:`FetchSettings` and :class:`DeliveryPolicy` fields."""
    return KafkaSource(
        KafkaSourceConfig(topic=topic, group=group),
        pipeline=pipeline,
        bootstrap_servers=bootstrap,
        dispatch=dispatch,
        sinks=SourceSinks(
            sink=KafkaSink(KafkaSinkConfig(topic=out_topic), bootstrap_servers=bootstrap),
            dead_letter=(
                KafkaSink(
                    KafkaSinkConfig(topic=dlq_topic, mode="structured"),
                    bootstrap_servers=bootstrap,
                )
                if dlq_topic
                else None
            ),
        ),
        fetch=FetchSettings(**{"session_timeout_ms": 6000, **(fetch or {})}),
        delivery=DeliveryPolicy(**{"retry_initial_s": 0.05, **delivery}),
    )


async def double_even(events: list[CloudEvent]) -> list[Outcome]:
    """Drop odd n, double even n, fail every 100th."""
    await asyncio.sleep(0)
    out: list[Outcome] = []
    for e in events:
        n = e.data["n"]
        if n % 100 == 0:
            out.append(Failure("double", "ValueError", f"n={n} is a multiple of 100", attempts=3))
        elif n % 2:
            out.append([])
        else:
            out.append(
                [e.replace(id=e.id + "-out", type="doubled", data={"n": n, "doubled": 2 * n})]
            )
    return out


async def test_source_delivers_every_output_once_in_order(kafka_bootstrap, topic_factory, capsys):
    n_events, partitions = 12_000, 3
    src = topic_factory("in", partitions=partitions)
    out = topic_factory("out", partitions=partitions)
    dlq = topic_factory("dlq", partitions=1)
    records: list[Record] = []
    for i in range(n_events):
        p = i % partitions
        key = f"k{p}-{i // partitions % 7}".encode()
        records.append((p, key, orjson.dumps({"n": i, "key": key.decode()}), []))
    per_partition = await produce(kafka_bootstrap, src, records)

    source = make_source(kafka_bootstrap, src, double_even, out, dlq, pipeline=f"p-{src}")
    await run_until_committed(source, n_events)
    stats = source.stats()
    expected_outputs = {i for i in range(n_events) if i % 2 == 0 and i % 100}
    expected_failed = {i for i in range(n_events) if i % 100 == 0}
    assert stats["consumed"] == n_events
    assert stats["committed"] == n_events
    assert stats["outputs"] == len(expected_outputs)
    assert stats["failed"] == stats["dead_lettered"] == len(expected_failed)
    assert stats["dropped"] == n_events - len(expected_outputs) - len(expected_failed)
    assert stats["decode_errors"] == stats["dispatch_retries"] == stats["in_flight"] == 0
    assert 1 <= stats["batches"] <= n_events

    # Every expected output exactly once, with its contents, per-key order kept.
    got = await read_all(kafka_bootstrap, out, len(expected_outputs))
    assert len(got) == len(expected_outputs)
    events = [decode_record(r) for r in got]
    ns = [e.data["n"] for e in events]
    assert sorted(ns) == sorted(expected_outputs)
    by_key: dict[str, list[int]] = defaultdict(list)
    for r, e in zip(got, events, strict=True):
        assert e.type == "doubled"
        assert e.id == f"{src}-{e.data['n'] % partitions}-{e.data['n'] // partitions}-out"
        assert e.source == f"kafka://{src}"
        assert e.data["doubled"] == 2 * e.data["n"]
        assert r.key.decode() == e["partitionkey"]
        by_key[e["partitionkey"]].append(e.data["n"])
    for key, seq in by_key.items():
        assert seq == sorted(seq), f"order broken for key {key}"

    # Failures in the dead-letter topic: the original event plus the error attributes.
    dead = await read_all(kafka_bootstrap, dlq, len(expected_failed))
    assert len(dead) == len(expected_failed)
    dead_events = [decode_record(r) for r in dead]
    assert {e.data["n"] for e in dead_events} == expected_failed
    for e in dead_events:
        n = e.data["n"]
        assert e.type == "eventbus.message"
        assert e.id == f"{src}-{n % partitions}-{n // partitions}"
        assert e["ebpipeline"] == f"p-{src}"
        assert e["ebstep"] == "double"
        assert e["eberrortype"] == "ValueError"
        assert e["eberror"] == f"n={n} is a multiple of 100"
        assert e["ebattempts"] == 3
        assert (e["ebtopic"], e["ebpartition"], e["eboffset"]) == (
            src,
            n % partitions,
            n // partitions,
        )

    # Offsets committed up to the end of every partition.
    committed = await committed_offsets(kafka_bootstrap, source.group, src, partitions)
    assert committed == per_partition


async def test_source_throughput_trivial_dispatch(kafka_bootstrap, topic_factory, capsys):
    n_events, partitions = 60_000, 3
    src = topic_factory("in", partitions=partitions)
    out = topic_factory("out", partitions=partitions)
    records = [
        (i % partitions, None, orjson.dumps({"n": i, "payload": "x" * 40}), [])
        for i in range(n_events)
    ]
    await produce(kafka_bootstrap, src, records)
    first: list[float] = []

    async def passthrough(events: list[CloudEvent]) -> list[Outcome]:
        if not first:
            first.append(time.perf_counter())
        return [[e] for e in events]

    source = make_source(kafka_bootstrap, src, passthrough, out, None, pipeline=f"p-{src}")
    await source.start()
    runner = asyncio.create_task(source.run())
    try:
        await wait_for(
            lambda: source.stats()["committed"] >= n_events, 30, lambda: str(source.stats())
        )
        elapsed = time.perf_counter() - first[0]
        # the log ends the autoscaler reads (partitions held, arrival rate): every partition
        # of the topic, at its end
        assert source.log_ends() == {
            f"{src}[{p}]": n_events // partitions for p in range(partitions)
        }
    finally:
        await source.stop()
        await runner
    stats = source.stats()
    assert stats["outputs"] == n_events
    rate = n_events / elapsed
    with capsys.disabled():
        print(
            f"\nKafkaSource throughput: {n_events} events in {elapsed:.2f} s = {rate:,.0f} events/s "
            f"(consume, decode, dispatch, encode, produce acks=all, commit; {stats['batches']} batches)"
        )
    # speed is the benchmarks' (benchmarks/); here the work that sets it is counted: records
    # waiting at the broker go in full micro-batches, never a dispatch per event or a few
    assert stats["batches"] <= n_events // 50, stats


async def test_dispatch_raising_twice_loses_nothing(kafka_bootstrap, topic_factory):
    n_events = 600
    src = topic_factory("in", partitions=3)
    out = topic_factory("out", partitions=1)
    await produce(
        kafka_bootstrap, src, [(i % 3, None, orjson.dumps({"n": i}), []) for i in range(n_events)]
    )
    calls = 0

    async def flaky(events: list[CloudEvent]) -> list[Outcome]:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise ConnectionError("replica died")
        return [[e] for e in events]

    source = make_source(
        kafka_bootstrap, src, flaky, out, None, pipeline=f"p-{src}", fetch={"max_in_flight": 1}
    )
    await run_until_committed(source, n_events)
    stats = source.stats()
    assert stats["dispatch_retries"] == 2
    assert stats["outputs"] == n_events
    got = await read_all(kafka_bootstrap, out, n_events)
    assert sorted(orjson.loads(r.value)["n"] for r in got) == list(range(n_events))
    assert await committed_offsets(kafka_bootstrap, source.group, src, 3) == {
        0: 200,
        1: 200,
        2: 200,
    }


async def test_undecodable_records_are_counted_and_dead_lettered(kafka_bootstrap, topic_factory):
    src = topic_factory("in", partitions=1)
    out = topic_factory("out", partitions=1)
    dlq = topic_factory("dlq", partitions=1)
    good_binary = CloudEvent.create(type="t.binary", source="/test", id="b1", data={"n": 1})
    good_structured = CloudEvent.create(type="t.structured", source="/test", id="s1", data={"n": 2})
    bh, bv = encode_kafka_binary(good_binary)
    sh, sv = encode_kafka_structured(good_structured)
    bad_version = [
        ("ce_specversion", b"0.3"),
        ("ce_id", b"x"),
        ("ce_source", b"/s"),
        ("ce_type", b"t"),
    ]
    records: list[Record] = [
        (0, b"k0", orjson.dumps({"n": 0}), []),
        (0, None, b"\x00raw", bad_version),  # offset 1
        (0, None, bv, bh),
        (0, b"kbad", b"{not json", [("content-type", b"application/cloudevents+json")]),  # offset 3
        (0, None, sv, sh),
        (0, None, b"{}", [*bad_version[1:], ("ce_specversion", b"1.0"), ("ce_time", b"yesterday")]),
    ]
    await produce(kafka_bootstrap, src, records)

    async def identity(events: list[CloudEvent]) -> list[Outcome]:
        return [[e] for e in events]

    source = make_source(kafka_bootstrap, src, identity, out, dlq, pipeline=f"p-{src}")
    await run_until_committed(source, len(records))
    stats = source.stats()
    assert stats["decode_errors"] == 3
    assert stats["dead_lettered"] == 3
    assert stats["outputs"] == 3

    got = [decode_record(r) for r in await read_all(kafka_bootstrap, out, 3)]
    assert [e.id for e in got] == [f"{src}-0-0", "b1", "s1"]
    assert got[0]["partitionkey"] == "k0"

    dead = await read_all(kafka_bootstrap, dlq, 3)
    dead_events = [decode_record(r) for r in dead]
    assert [e.type for e in dead_events] == [DECODE_ERROR_TYPE] * 3
    assert [e["eboffset"] for e in dead_events] == [1, 3, 5]
    assert [e.data for e in dead_events] == [b"\x00raw", b"{not json", b"{}"]
    assert [r.key for r in dead] == [None, b"kbad", None]
    assert dead_events[0]["eberror"] == (
        f"{src}[0]@1: header ce_specversion is '0.3'; EventBus speaks CloudEvents 1.0 "
        "(ce_specversion: 1.0)"
    )
    assert "value is not valid JSON" in dead_events[1]["eberror"]
    assert "header ce_time is 'yesterday'" in dead_events[2]["eberror"]
    for e in dead_events:
        assert e["eberrortype"] == "EventDecodeError"
        assert e["ebstep"] == "decode"
        assert e["ebpipeline"] == f"p-{src}"
        assert e["ebtopic"] == src
    assert await committed_offsets(kafka_bootstrap, source.group, src, 1) == {0: len(records)}


async def test_unencodable_outputs_dead_letter_their_inputs(kafka_bootstrap, topic_factory):
    src = topic_factory("in", partitions=1)
    out = topic_factory("out", partitions=1)
    dlq = topic_factory("dlq", partitions=1)
    await produce(kafka_bootstrap, src, [(0, None, orjson.dumps({"n": i}), []) for i in range(30)])

    async def sloppy(events: list[CloudEvent]) -> list[Outcome]:
        out: list[Outcome] = []
        for e in events:
            n = e.data["n"]
            if n == 7:
                out.append([e.replace(data={"bad": {1, 2}})])  # a set is not JSON
            elif n == 8:
                out.append([{"not": "an event"}])  # type: ignore[list-item]
            else:
                out.append([e])
        return out

    source = make_source(kafka_bootstrap, src, sloppy, out, dlq, pipeline=f"p-{src}")
    await run_until_committed(source, 30)
    stats = source.stats()
    assert (stats["outputs"], stats["failed"], stats["dead_lettered"]) == (28, 2, 2)
    got = await read_all(kafka_bootstrap, out, 28)
    assert [orjson.loads(r.value)["n"] for r in got] == [n for n in range(30) if n not in (7, 8)]
    dead = [decode_record(r) for r in await read_all(kafka_bootstrap, dlq, 2)]
    assert [e.data for e in dead] == [{"n": 7}, {"n": 8}]
    assert [e["ebstep"] for e in dead] == ["sink", "sink"]
    assert [e["eberrortype"] for e in dead] == ["TypeError", "AttributeError"]


async def test_rebalance_commits_in_flight_batches(kafka_bootstrap, topic_factory):
    n_events, partitions = 4_000, 4
    src = topic_factory("in", partitions=partitions)
    out = topic_factory("out", partitions=1)
    await produce(
        kafka_bootstrap,
        src,
        [(i % partitions, None, orjson.dumps({"n": i}), []) for i in range(n_events)],
    )

    async def slow(events: list[CloudEvent]) -> list[Outcome]:
        # slow enough that a's 4,000 events take ~8 s: b's join (a learns of it at its next
        # heartbeat, 2 s apart) rebalances while a has batches in flight
        await asyncio.sleep(0.4)
        return [[e] for e in events]

    group = f"g-{src}"
    common: dict[str, Any] = {"fetch": {"max_batch": 50, "max_in_flight": 4}, "group": group}
    a = make_source(kafka_bootstrap, src, slow, out, None, pipeline="a", **common)
    b = make_source(kafka_bootstrap, src, slow, out, None, pipeline="b", **common)
    await a.start()
    run_a = asyncio.create_task(a.run())
    await wait_for(lambda: a.stats()["committed"] >= 200, 30, lambda: str(a.stats()))
    await b.start()
    run_b = asyncio.create_task(b.run())
    try:
        await wait_for(
            lambda: (
                b.stats()["consumed"] > 0
                and a.stats()["committed"] + b.stats()["committed"] >= n_events
            ),
            90,
            lambda: f"a={a.stats()} b={b.stats()}",
        )
    finally:
        await a.stop()
        await b.stop()
        await run_a
        await run_b
    got = await read_all(kafka_bootstrap, out, n_events)
    ns = [orjson.loads(r.value)["n"] for r in got]
    assert set(ns) == set(range(n_events))  # at-least-once: nothing lost
    duplicates = len(ns) - n_events
    assert duplicates <= 4 * 50 * 4  # at most the batches in flight of the revoked partitions
    committed = await committed_offsets(kafka_bootstrap, group, src, partitions)
    assert committed == dict.fromkeys(range(partitions), n_events // partitions)


async def test_stop_drains_in_flight_batches_and_the_group_resumes(kafka_bootstrap, topic_factory):
    n_events = 600
    src = topic_factory("in", partitions=1)
    out = topic_factory("out", partitions=1)
    await produce(
        kafka_bootstrap, src, [(0, None, orjson.dumps({"n": i}), []) for i in range(n_events)]
    )

    async def slow(events: list[CloudEvent]) -> list[Outcome]:
        await asyncio.sleep(0.2)
        return [[e] for e in events]

    group = f"g-{src}"
    opts: dict[str, Any] = {"fetch": {"max_batch": 50, "max_in_flight": 4}, "group": group}
    first = make_source(kafka_bootstrap, src, slow, out, None, pipeline="first", **opts)
    await first.start()
    run_first = asyncio.create_task(first.run())
    await wait_for(lambda: first.stats()["batches"] >= 3, 30, lambda: str(first.stats()))
    await first.stop(drain=True)
    await run_first
    done = first.stats()
    assert done["in_flight"] == 0
    assert 0 < done["committed"] == done["consumed"] == done["outputs"] < n_events
    assert await committed_offsets(kafka_bootstrap, group, src, 1) == {0: done["committed"]}

    second = make_source(kafka_bootstrap, src, slow, out, None, pipeline="second", **opts)
    await second.start()
    run_second = asyncio.create_task(second.run())
    try:
        await wait_for(
            lambda: second.stats()["committed"] >= n_events - done["committed"],
            30,
            lambda: str(second.stats()),
        )
    finally:
        await second.stop()
        await run_second
    got = await read_all(kafka_bootstrap, out, n_events)
    assert [orjson.loads(r.value)["n"] for r in got] == list(range(n_events))  # once, in order


async def test_kafka_sink_modes_and_keys(kafka_bootstrap, topic_factory):
    from aiokafka.partitioner import DefaultPartitioner

    topic = topic_factory("sink", partitions=4)
    binary = KafkaSink(KafkaSinkConfig(topic=topic), bootstrap_servers=kafka_bootstrap)
    structured = KafkaSink(
        KafkaSinkConfig(topic=topic, mode="structured"), bootstrap_servers=kafka_bootstrap
    )
    items: list[tuple[CloudEvent, bytes | None]] = []
    for i in range(60):
        extra = {"partitionkey": f"pk{i % 5}"} if i % 3 == 0 else {}
        event = CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"i": i}, **extra)
        items.append((event, f"k{i % 7}".encode() if i % 3 == 1 else None))
    await binary.start()
    await structured.start()
    try:
        await binary.send(items[:30])
        await structured.send(items[30:])
        await binary.send([])
    finally:
        await binary.stop()
        await structured.stop()
    with pytest.raises(RuntimeError, match="is not started; await start"):
        await binary.send(items[:1])

    got = await read_all(kafka_bootstrap, topic, len(items))
    assert len(got) == len(items)
    by_id = {decode_record(r).id: r for r in got}
    for i, (event, key) in enumerate(items):
        r = by_id[event.id]
        want_key = event.get("partitionkey", "").encode() or key
        assert r.key == want_key
        if want_key is not None:  # the Java client's partitioning (murmur2)
            assert r.partition == DefaultPartitioner()(want_key, [0, 1, 2, 3], [0, 1, 2, 3])
        names = [h[0] for h in r.headers]
        if i < 30:
            assert "ce_id" in names and orjson.loads(r.value) == {"i": i}
        else:
            assert names == ["content-type"] and orjson.loads(r.value)["id"] == event.id
        decoded = decode_record(r)
        expected = event.replace(partitionkey=want_key.decode()) if want_key else event
        assert decoded == expected
    # Keyless records of one send() share a partition (sticky); the next send() takes the next.
    keyless_first = {r.partition for r in got if r.key is None and decode_record(r).data["i"] < 30}
    keyless_second = {
        r.partition for r in got if r.key is None and decode_record(r).data["i"] >= 30
    }
    assert len(keyless_first) == 1 and len(keyless_second) == 1


async def test_failed_events_are_retried_alone_and_batch_mates_go_at_once(
    kafka_bootstrap, topic_factory
):
    from eventbus.eventing._delivery import RetryPolicy

    n_events = 300
    src = topic_factory("in", partitions=1)
    out = topic_factory("out", partitions=1)
    dlq = topic_factory("dlq", partitions=1)
    await produce(
        kafka_bootstrap, src, [(0, None, orjson.dumps({"n": i}), []) for i in range(n_events)]
    )
    tries: dict[int, int] = {}
    redispatched: list[list[int]] = []

    async def flaky(events: list[CloudEvent]) -> list[Outcome]:
        ns = [e.data["n"] for e in events]
        if all(n % 10 == 0 for n in ns):
            redispatched.append(ns)
        out_: list[Outcome] = []
        for e in events:
            n = e.data["n"]
            tries[n] = tries.get(n, 0) + 1
            if n % 10 == 0 and (n % 20 == 0 or tries[n] < 3):
                # multiples of 20 always fail; other multiples of 10 succeed on the 3rd try
                out_.append(Failure("score", "TimeoutError", f"n={n} timed out"))
            else:
                out_.append([e])
        return out_

    policy = RetryPolicy(retries=3, initial_s=0.01, max_s=0.05, jitter=0.5)
    source = make_source(kafka_bootstrap, src, flaky, out, dlq, pipeline=f"p-{src}", retry=policy)
    await run_until_committed(source, n_events)
    stats = source.stats()
    assert stats["outputs"] == n_events - n_events // 20
    assert stats["dead_lettered"] == n_events // 20
    assert redispatched and all(
        all(n % 10 == 0 for n in ns) for ns in redispatched
    )  # only the failures again
    assert all(tries[n] == 4 for n in range(0, n_events, 20))  # 1 try + 3 retries
    assert all(tries[n] == 3 for n in range(10, n_events, 20))
    assert all(tries[n] == 1 for n in range(n_events) if n % 10)
    dead = [decode_record(r) for r in await read_all(kafka_bootstrap, dlq, n_events // 20)]
    assert sorted(e.data["n"] for e in dead) == list(range(0, n_events, 20))
    assert {e["ebattempts"] for e in dead} == {4} and {e["ebstep"] for e in dead} == {"score"}
    got = [
        decode_record(r).data["n"]
        for r in await read_all(kafka_bootstrap, out, n_events - n_events // 20)
    ]
    assert sorted(got) == [n for n in range(n_events) if n % 20]


async def test_max_age_stops_retries(kafka_bootstrap, topic_factory):
    from eventbus.eventing._delivery import RetryPolicy

    src = topic_factory("in", partitions=1)
    out = topic_factory("out", partitions=1)
    dlq = topic_factory("dlq", partitions=1)
    await produce(kafka_bootstrap, src, [(0, None, orjson.dumps({"n": 1}), [])])

    async def always_fails(events: list[CloudEvent]) -> list[Outcome]:
        return [Failure("score", "ValueError", "no") for _ in events]

    policy = RetryPolicy(retries=100, initial_s=0.05, max_s=0.05, jitter=0, max_age_s=0.3)
    source = make_source(
        kafka_bootstrap, src, always_fails, out, dlq, pipeline=f"p-{src}", retry=policy
    )
    await run_until_committed(source, 1)
    [dead] = [decode_record(r) for r in await read_all(kafka_bootstrap, dlq, 1)]
    assert "gave up: max_age_s 0.3 reached" in dead["eberror"]
    assert 3 <= dead["ebattempts"] <= 10


async def test_dedupe_suppresses_outputs_already_delivered(
    kafka_bootstrap, redis_url, topic_factory
):
    from eventbus.eventing._delivery import RedisDeduper

    n_events = 500
    src = topic_factory("in", partitions=2)
    out = topic_factory("out", partitions=1)
    await produce(
        kafka_bootstrap, src, [(i % 2, None, orjson.dumps({"n": i}), []) for i in range(n_events)]
    )

    async def identity(events: list[CloudEvent]) -> list[Outcome]:
        return [[e] for e in events]

    pipeline = f"p-{src}"
    for group in ("first", "second"):  # the second group reads everything again: a redelivery
        source = make_source(
            kafka_bootstrap,
            src,
            identity,
            out,
            None,
            pipeline=pipeline,
            group=f"{group}-{src}",
            dedupe=RedisDeduper(redis_url, pipeline, 60),
        )
        await run_until_committed(source, n_events)
        stats = source.stats()
        if group == "first":
            assert stats["outputs"] == n_events and stats["duplicates"] == 0
        else:
            assert stats["outputs"] == 0 and stats["duplicates"] == n_events
    got = await read_all(kafka_bootstrap, out, n_events)
    assert len(got) == n_events


async def test_sink_lanes_keep_keyless_records_to_their_partitions(kafka_bootstrap, topic_factory):
    # Two producers writing one topic concurrently, as the gateway's do: each keyless record
    # lands in its own lane's partitions, and every lane's partitions take turns.
    topic = topic_factory("lanes", partitions=4)
    sinks = [
        KafkaSink(KafkaSinkConfig(topic=topic), bootstrap_servers=kafka_bootstrap, lane=(i, 2))
        for i in range(2)
    ]
    for sink in sinks:
        await sink.start()
    try:
        sends = []
        for lane, sink in enumerate(sinks):
            for call in range(4):
                batch = [
                    (
                        CloudEvent.create(
                            type="t", source="/s", id=f"l{lane}-c{call}-{i}", data={"lane": lane}
                        ),
                        None,
                    )
                    for i in range(10)
                ]
                sends.append(sink.send(batch))
        await asyncio.gather(*sends)
    finally:
        for sink in sinks:
            await sink.stop()
    got = await read_all(kafka_bootstrap, topic, 80)
    assert len(got) == 80
    partitions_of = defaultdict(set)
    for r in got:
        partitions_of[decode_record(r).data["lane"]].add(r.partition)
    assert partitions_of == {0: {0, 2}, 1: {1, 3}}


async def test_linger_paces_fetches_while_records_keep_coming(kafka_bootstrap, topic_factory):
    # 30 records arriving one every 20 ms: with linger_ms 250 the source fetches (and
    # dispatches) at most every 250 ms, so they come in a few batches, none lost.
    src, out = topic_factory("pace-in"), topic_factory("pace-out")
    calls: list[int] = []

    async def count(events: list[CloudEvent]) -> list[Outcome]:
        calls.append(len(events))
        return [[e.replace(id=e.id + "-out")] for e in events]

    source = make_source(
        kafka_bootstrap, src, count, out, None, pipeline=f"p-{src}", fetch={"linger_ms": 250}
    )
    await source.start()
    runner = asyncio.create_task(source.run())
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        started = time.monotonic()
        for i in range(30):
            await producer.send_and_wait(src, orjson.dumps({"n": i}))
            await asyncio.sleep(0.02)
        produced_s = time.monotonic() - started
        await wait_for(lambda: source.stats()["committed"] >= 30, 30, lambda: str(source.stats()))
    finally:
        await producer.stop()
        await source.stop()
        await runner
    assert sum(calls) == 30
    # one dispatch per record (30) without pacing; one per 250 ms (and the first) with it
    assert len(calls) <= produced_s / 0.25 + 3, (calls, produced_s)
    got = await read_all(kafka_bootstrap, out, 30)
    assert sorted(decode_record(r).data["n"] for r in got) == list(range(30))


async def test_concurrent_producers_on_one_partition_lose_nothing(kafka_bootstrap, topic_factory):
    # Tansu reserves a batch's offsets before it stores it: while three producers write one
    # partition, a fetch can find a later batch before an earlier one (a consumer that took
    # it as it came skipped ~1 record in 1,500 here). The source waits for such gaps.
    src, out = topic_factory("race-in"), topic_factory("race-out")
    n_per, n_producers = 1500, 3

    async def write(i: int) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
        await producer.start()
        try:
            for k in range(n_per):
                await producer.send_and_wait(src, orjson.dumps({"n": i * n_per + k}), partition=0)
        finally:
            await producer.stop()

    async def identity(events: list[CloudEvent]) -> list[Outcome]:
        return [[e.replace(id=e.id + "-out")] for e in events]

    source = make_source(
        kafka_bootstrap, src, identity, out, None, pipeline=f"p-{src}", fetch={"linger_ms": 0}
    )
    await source.start()
    runner = asyncio.create_task(source.run())
    total = n_per * n_producers
    try:
        await asyncio.gather(*(write(i) for i in range(n_producers)))
        await wait_for(
            lambda: source.stats()["committed"] >= total, 60, lambda: str(source.stats())
        )
    finally:
        await source.stop()
        await runner
    assert source.stats()["consumed"] == total
    got = await read_all(kafka_bootstrap, out, total)
    assert sorted(decode_record(r).data["n"] for r in got) == list(range(total))


@pytest.mark.kafka_only  # Tansu takes any session timeout
async def test_a_session_timeout_the_broker_refuses_is_named_with_the_fix(
    kafka_bootstrap, topic_factory
):
    from eventbus.errors import StackError

    src = topic_factory("in")
    source = make_source(
        kafka_bootstrap,
        src,
        double_even,
        topic_factory("out"),
        None,
        pipeline=f"p-{src}",
        fetch={"session_timeout_ms": 2000},  # below Apache Kafka's group.min.session.timeout.ms
    )
    with pytest.raises(StackError) as info:
        await source.start()
    msg = str(info.value)
    assert "the broker refused the consumer group's session timeout" in msg
    assert "set the source's session_timeout_ms within the broker's group.min.session" in msg
