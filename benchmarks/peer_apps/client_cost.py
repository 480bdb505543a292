"""CPU per record of one Kafka client, consuming and producing: ``benchmarks/kafka_clients.py``
runs it once per client, each with its own interpreter.

``client_cost.py aiokafka|confluent BOOTSTRAP SOURCE SINK N``: consumes the ``N`` records of
``SOURCE`` (3 partitions, from the start) in batches of up to 2,000, touching what the
EventBus source reads of each record (key, value, headers, offset, partition, timestamp);
then produces ``N`` records of the same size to ``SINK`` with the headers, acks from all
replicas awaited. Prints one JSON line: wall seconds, the process's CPU seconds (every thread)
and the main thread's (the one that holds the GIL for the Python work), per phase.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from typing import Any


def cpu() -> tuple[float, float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime, time.thread_time()


def span(a: tuple[float, float, float], b: tuple[float, float, float]) -> dict[str, float]:
    return {"wall_s": b[0] - a[0], "process_cpu_s": b[1] - a[1], "thread_cpu_s": b[2] - a[2]}


def touch(key: Any, value: Any, headers: Any, offset: int, partition: int, ts: Any) -> int:
    return (
        len(value) + len(headers or ()) + offset + partition + (1 if key else 0) + (1 if ts else 0)
    )


async def with_aiokafka(bootstrap: str, src: str, sink: str, n: int) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=10,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    consumer.assign([TopicPartition(src, p) for p in range(3)])
    records: list[Any] = []
    t0 = cpu()
    while len(records) < n:
        batch = await consumer.getmany(timeout_ms=100, max_records=2000)
        for recs in batch.values():
            for r in recs:
                touch(r.key, r.value, r.headers, r.offset, r.partition, r.timestamp)
                records.append((r.key, r.value, list(r.headers)))
    t1 = cpu()
    await consumer.stop()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=0, max_batch_size=512 * 1024
    )
    await producer.start()
    t2 = cpu()
    futs = []
    for start in range(0, n, 2000):  # a batch of outputs at a time, as the sink sends them
        per_part: dict[int, Any] = {}
        for i, (key, value, headers) in enumerate(records[start : start + 2000]):
            part = i % 3
            out = per_part.get(part) or per_part.setdefault(part, producer.create_batch())
            if out.append(key=key, value=value, timestamp=None, headers=headers) is None:
                futs.append(await producer.send_batch(out, sink, partition=part))
                out = per_part[part] = producer.create_batch()
                out.append(key=key, value=value, timestamp=None, headers=headers)
        for part, out in per_part.items():
            futs.append(await producer.send_batch(out, sink, partition=part))
        await asyncio.gather(*futs)
        futs.clear()
    t3 = cpu()
    await producer.stop()
    return {"consume": span(t0, t1), "produce": span(t2, t3)}


def with_confluent(bootstrap: str, src: str, sink: str, n: int) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "client-cost",  # never joined: assign, no commit
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(src, p, OFFSET_BEGINNING) for p in range(3)])
    records: list[Any] = []
    t0 = cpu()
    while len(records) < n:
        for m in consumer.consume(2000, timeout=0.1):
            if m.error() is None:
                touch(m.key(), m.value(), m.headers(), m.offset(), m.partition(), m.timestamp())
                records.append((m.key(), m.value(), m.headers()))
    t1 = cpu()
    consumer.close()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    t2 = cpu()
    for start in range(0, n, 2000):
        for i, (key, value, headers) in enumerate(records[start : start + 2000]):
            producer.produce(sink, value, key, partition=i % 3, headers=headers)
        producer.flush()
    t3 = cpu()
    return {"consume": span(t0, t1), "produce": span(t2, t3)}


def main(client: str, bootstrap: str, src: str, sink: str, n: int) -> None:
    if client == "aiokafka":
        out = asyncio.run(with_aiokafka(bootstrap, src, sink, n))
    else:
        out = with_confluent(bootstrap, src, sink, n)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
