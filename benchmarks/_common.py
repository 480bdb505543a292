"""Shared parts of the Kafka benchmarks: the events, the broker, the aiokafka baseline loop,
EventBus's pipeline, and the tail consumer that times end-to-end latency.

``kafka_pipeline.py`` (EventBus against the loop) and ``peers.py`` (EventBus against the
frameworks a user could pick instead) both measure with these, so their figures compare.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault(
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "0"
)  # as `eventbus up` runs Ray
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

PARTITIONS = 3
CURRENCIES = ["CNY", "USD", "EUR", "CNY", "USD"]


#: Extra Kafka client settings of every client made here (``kafka_pipeline.py --tls`` puts
#: the TLS settings in it, from ``kafka_client_kwargs``); empty: plaintext.
KAFKA_KWARGS: dict[str, Any] = {}


def make_values(n: int) -> list[tuple[list[tuple[str, bytes]], bytes, bytes]]:
    out = []
    for i in range(n):
        t = b"payment.created" if i % 10 else b"payment.refunded"
        headers = [
            ("ce_specversion", b"1.0"),
            ("ce_id", f"p{i}".encode()),
            ("ce_source", b"/shop"),
            ("ce_type", t),
            ("content-type", b"application/json"),
        ]
        data = {"amount": (i * 37) % 400, "currency": CURRENCIES[i % 5], "order": i}
        out.append((headers, orjson.dumps(data), str(i % 64).encode()))
    return out


async def produce_all(bootstrap: str, topic: str, n: int) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        max_batch_size=512 * 1024,
        **KAFKA_KWARGS,
    )
    await producer.start()
    try:
        values = make_values(n)
        futs = []
        for part in range(PARTITIONS):
            batch = producer.create_batch()
            for headers, value, key in values[part::PARTITIONS]:
                if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    futs.append(await producer.send_batch(batch, topic, partition=part))
                    batch = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=None, headers=headers)
            futs.append(await producer.send_batch(batch, topic, partition=part))
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


def expected_outputs(n: int) -> int:
    return sum(
        1
        for i in range(n)
        if i % 10 and (i * 37) % 400 > 100 and CURRENCIES[i % 5] in ("CNY", "USD")
    )


async def sink_span(
    bootstrap: str, topic: str, expect: int, timeout_s: float = 300
) -> tuple[int, float]:
    """Wait for ``expect`` records on ``topic``; return (count, last-first broker timestamp in s)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        # what a transactional (exactly_once) pipeline committed; the same as read_uncommitted
        # for the others (no transactions)
        isolation_level="read_committed",
        **KAFKA_KWARGS,
    )
    await consumer.start()
    count, first, last = 0, None, None
    deadline = time.monotonic() + timeout_s
    try:
        while count < expect and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200, max_records=10000)
            for records in batch.values():
                for r in records:
                    count += 1
                    first = r.timestamp if first is None else min(first, r.timestamp)
                    last = r.timestamp if last is None else max(last, r.timestamp)
    finally:
        await consumer.stop()
    if count < expect:
        msg = f"only {count} of {expect} outputs arrived on {topic} within {timeout_s} s"
        raise RuntimeError(msg)
    return count, max((last - first) / 1000, 1e-3)  # type: ignore[operator]


# -- the baseline: one process, aiokafka, per-batch commits -------------------------------------


async def baseline(
    bootstrap: str,
    src: str,
    sink: str,
    n: int,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Consume ``n`` records (or until ``stop``), filter/convert, produce, commit per batch;
    ``ready`` is set once the group gave the consumer its partitions."""
    consumer = AIOKafkaConsumer(
        src,
        bootstrap_servers=bootstrap,
        group_id=f"baseline-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        # Apache Kafka refuses less than its group.min.session.timeout.ms (6 s); the peers'
        # group members (peer_apps/) use the same
        session_timeout_ms=6000,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_wait_ms=10,
        **KAFKA_KWARGS,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=0,
        max_batch_size=512 * 1024,
        **KAFKA_KWARGS,
    )
    await consumer.start()
    await producer.start()
    consumed = 0
    try:
        while (stop is None and consumed < n) or (stop is not None and not stop.is_set()):
            batch = await consumer.getmany(timeout_ms=100, max_records=2000)
            if ready is not None and not ready.is_set() and consumer.assignment():
                ready.set()
            futs = []
            for tp, records in batch.items():
                out = producer.create_batch()
                for r in records:
                    consumed += 1
                    h = dict(r.headers)
                    data = orjson.loads(r.value)
                    if (
                        h.get("ce_type") == b"payment.created"
                        and data["amount"] > 100
                        and data["currency"] in ("CNY", "USD")
                    ):
                        data["amount_cny"] = data["amount"] * 7.1
                        h["ce_type"] = b"payment.large"
                        hdrs = list(h.items())
                        val = orjson.dumps(data)
                        if out.append(key=r.key, value=val, timestamp=None, headers=hdrs) is None:
                            futs.append(
                                await producer.send_batch(out, sink, partition=tp.partition)
                            )
                            out = producer.create_batch()
                            out.append(key=r.key, value=val, timestamp=None, headers=hdrs)
                if out.record_count():
                    futs.append(await producer.send_batch(out, sink, partition=tp.partition))
            await asyncio.gather(*futs)
            if batch:
                await consumer.commit({tp: recs[-1].offset + 1 for tp, recs in batch.items()})
    finally:
        await consumer.stop()
        await producer.stop()


# -- EventBus ---------------------------------------------------------------------------------

PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources: [{{kafka: {{topic: {src}}}}}]
  steps:
    - id: only_large
      filter: "type == 'payment.created' && data.amount > 100 && data.currency in ['CNY', 'USD']"
    - id: to_cny
      convert: {{set: {{data.amount_cny: "double(data.amount) * 7.1", type: "'payment.large'"}}}}
  sink: {{kafka: {{topic: {sink}}}}}
  serving: {{replicas: {replicas}, batch: {{max_size: 2000}}}}
"""


async def latency_run(
    bootstrap: str,
    src: str,
    sink: str,
    rate: float,
    seconds: float,
    stages: list[tuple[float, float]] | None = None,
) -> list[float]:
    """Produce at ``rate`` events/s (each carrying its send time); latencies in ms at a tail.

    ``stages``: a list that gets, per output, (the output's record timestamp − send time, its
    arrival − that timestamp) in ms: the time to the system's producer (fetch, batching,
    steps, encoding; the producer stamps the record when it appends it) and the time from
    there to the tail (produce request, broker, the tail's fetch).
    """
    consumer = AIOKafkaConsumer(
        sink,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="latest",
        enable_auto_commit=False,
        fetch_max_wait_ms=5,
        isolation_level="read_committed",  # an exactly_once pipeline's outputs at its commit
        **KAFKA_KWARGS,
    )
    await consumer.start()
    await consumer.seek_to_end()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=0, **KAFKA_KWARGS)
    await producer.start()
    lat: list[float] = []
    total = int(rate * seconds)
    expect = sum(1 for i in range(total) if i % 2 == 0)

    async def consume() -> None:
        deadline = time.monotonic() + seconds + 30
        while len(lat) < expect and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=50)
            now = time.time()
            for records in batch.values():
                for r in records:
                    t0 = orjson.loads(r.value)["t0"]
                    lat.append((now - t0) * 1000)
                    if stages is not None:
                        stamped = r.timestamp / 1000
                        stages.append(((stamped - t0) * 1000, (now - stamped) * 1000))

    # The load generator must stay cheap, or it steals the CPU it is measuring: headers and
    # values are made before the clock starts (the send time goes into a value template),
    # and events go out in 5 ms ticks, one record batch per partition, stamped when sent.
    headers = [
        [
            ("ce_specversion", b"1.0"),
            ("ce_id", f"l{i}".encode()),
            ("ce_source", b"/lat"),
            ("ce_type", b"payment.created"),
            ("content-type", b"application/json"),
        ]
        for i in range(total)
    ]
    templates = (
        b'{"amount":500,"currency":"USD","t0":%b}',
        b'{"amount":5,"currency":"USD","t0":%b}',
    )
    gc.collect()
    gc.freeze()  # the prepared headers stay out of every collection while the clock runs
    task = asyncio.create_task(consume())
    tick = 0.005
    start = time.monotonic()
    i = 0
    while i < total:
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        values = [t % repr(time.time()).encode() for t in templates]
        batches: dict[int, Any] = {}
        while i < due:
            value = values[i % 2]
            part = i % PARTITIONS
            batch = batches.get(part)
            if batch is None:
                batch = batches[part] = producer.create_batch()
            if batch.append(key=None, value=value, timestamp=None, headers=headers[i]) is None:
                await producer.send_batch(batch, src, partition=part)
                batch = batches[part] = producer.create_batch()
                batch.append(key=None, value=value, timestamp=None, headers=headers[i])
            i += 1
        for part, batch in batches.items():
            await producer.send_batch(batch, src, partition=part)
        await asyncio.sleep(tick)  # pacing the load generator
    await producer.flush()
    await task
    await producer.stop()
    await consumer.stop()
    gc.unfreeze()
    return lat


def wait_committed(redis_client: Any, pipeline: str, n: int, timeout_s: float = 300) -> None:
    """Poll the pipeline's published counters until ``n`` records are committed."""
    from eventbus.serving._replica_sources import read_stats

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sum(s.get("committed", 0) for s in read_stats(redis_client, pipeline, 1)) >= n:
            return
        time.sleep(0.25)  # a poll of the condition, four times a second: costs the replicas nothing
    msg = f"pipeline {pipeline!r} did not commit {n} records within {timeout_s} s"
    raise RuntimeError(msg)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def run_baseline_latency(
    bootstrap: str, rate: float, seconds: float, topics: Any
) -> list[float]:
    src, sink = await topics()
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(baseline(bootstrap, src, sink, 0, stop, ready))
    # its consumer joins its group first (Tansu holds a join for half the session timeout)
    joined = asyncio.ensure_future(ready.wait())
    await asyncio.wait([joined, task], timeout=60, return_when=asyncio.FIRST_COMPLETED)
    joined.cancel()
    if task.done():
        await task  # it failed: its error
    if not ready.is_set():
        stop.set()
        await task
        msg = "the baseline's consumer got no partitions within 60 s"
        raise RuntimeError(msg)
    lat = await latency_run(bootstrap, src, sink, rate, seconds)
    stop.set()
    await task
    return lat


def start_eventbus(bootstrap: str, redis_url: str) -> Any:
    """A local Ray cluster (2 CPUs, no dashboard) and an EventBus client on it."""
    import ray

    from eventbus.serving import EventBusClient

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        namespace="eventbus",
        logging_level="ERROR",
        log_to_driver=False,
    )
    return EventBusClient(None, bootstrap, redis_url)
