"""Join: orders and payments joined by order id with state in Redis, EventBus against a plain
asyncio redis-py loop doing the same state pattern in one process.

Both consume the same pre-produced, shuffled orders and payments topics on the real Tansu
broker and keep their state in the same real Redis:

* baseline: one asyncio process: ``getmany(2000)`` over both topics → per batch one pipelined
  round trip of ``HSET key side event; PEXPIRE key; HGETALL key`` per event (redis.asyncio) →
  a joined event for each key that now has both sides → ``send_batch`` → acks → commit;
* EventBus: the ``join`` step (inner mode, ``emit`` from ``--emit``, default ``every``; one
  Lua call per batch) on a Serve replica, with sink dedupe off and on.

Throughput: joined pairs per second between the first and last output record (broker
timestamps), median of rounds. Last line: one JSON object with the figures and ``ratio``
(EventBus / baseline pairs/s).

Run: ``.venv/bin/python benchmarks/join.py [--pairs 50000] [--rounds 3] [--emit every|first|latest]``;
with ``--redis-cluster`` it compares the state operations on a Redis Cluster with one Redis
instead (see ``benchmarks/_join_cluster.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault(
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "0"
)  # as `eventbus up` runs Ray
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kafka_pipeline import sink_span

from eventbus._internal.redis_service import start_redis
from eventbus._internal.services import create_topics, start_tansu

PARTITIONS = 3


async def produce_pairs(bootstrap: str, orders: str, payments: str, n: int, seed: int) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=512 * 1024
    )
    await producer.start()
    rnd = random.Random(seed)
    try:
        for topic, kind in ((orders, "order"), (payments, "payment")):
            idx = list(range(n))
            rnd.shuffle(idx)
            batches = {p: producer.create_batch() for p in range(PARTITIONS)}
            futs = []
            for j, i in enumerate(idx):
                p = j % PARTITIONS
                headers = [
                    ("ce_specversion", b"1.0"),
                    ("ce_id", f"{kind[0]}{i}".encode()),
                    ("ce_source", f"/{kind}".encode()),
                    ("ce_type", f"{kind}.created".encode()),
                    ("content-type", b"application/json"),
                ]
                value = orjson.dumps(
                    {"order_id": f"ord-{i}", "amount" if kind == "payment" else "item": i}
                )
                if (
                    batches[p].append(key=None, value=value, timestamp=None, headers=headers)
                    is None
                ):
                    futs.append(await producer.send_batch(batches[p], topic, partition=p))
                    batches[p] = producer.create_batch()
                    batches[p].append(key=None, value=value, timestamp=None, headers=headers)
            for p, b in batches.items():
                futs.append(await producer.send_batch(b, topic, partition=p))
            await asyncio.gather(*futs)
    finally:
        await producer.stop()


async def baseline(
    bootstrap: str, redis_url: str, orders: str, payments: str, sink: str, n: int
) -> None:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url)
    prefix = f"bench:join:{uuid.uuid4().hex[:6]}:"
    consumer = AIOKafkaConsumer(
        orders,
        payments,
        bootstrap_servers=bootstrap,
        group_id=f"baseline-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=2000,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_wait_ms=10,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=0, max_batch_size=512 * 1024
    )
    await consumer.start()
    await producer.start()
    joined = 0
    try:
        while joined < n:
            batch = await consumer.getmany(timeout_ms=100, max_records=2000)
            if not batch:
                continue
            pipe = r.pipeline(transaction=False)
            keys = []
            for records in batch.values():
                for rec in records:
                    h = dict(rec.headers)
                    data = orjson.loads(rec.value)
                    side = b"order" if h["ce_type"] == b"order.created" else b"payment"
                    key = prefix + data["order_id"]
                    pipe.hset(key, side, rec.value)
                    pipe.pexpire(key, 600_000)
                    pipe.hgetall(key)
                    keys.append(data["order_id"])
            results = await pipe.execute()
            out = producer.create_batch()
            futs = []
            for k, state in zip(keys, results[2::3]):
                if len(state) == 2:
                    joined += 1
                    value = orjson.dumps(
                        {
                            "order": orjson.loads(state[b"order"]),
                            "payment": orjson.loads(state[b"payment"]),
                        }
                    )
                    hdrs = [
                        ("ce_specversion", b"1.0"),
                        ("ce_id", f"j-{k}".encode()),
                        ("ce_source", b"/join"),
                        ("ce_type", b"order.paid"),
                    ]
                    if (
                        out.append(key=k.encode(), value=value, timestamp=None, headers=hdrs)
                        is None
                    ):
                        futs.append(await producer.send_batch(out, sink, partition=0))
                        out = producer.create_batch()
                        out.append(key=k.encode(), value=value, timestamp=None, headers=hdrs)
            if out.record_count():
                futs.append(await producer.send_batch(out, sink, partition=0))
            await asyncio.gather(*futs)
            await consumer.commit({tp: recs[-1].offset + 1 for tp, recs in batch.items()})
    finally:
        await consumer.stop()
        await producer.stop()
        await r.aclose()


PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources: [{{kafka: {{topic: {orders}}}}}, {{kafka: {{topic: {payments}}}}}]
  steps:
    - id: paid
      join:
        emit: {emit}
        sides:
          - {{name: order, when: "type == 'order.created'", key: data.order_id}}
          - {{name: payment, when: "type == 'payment.created'", key: data.order_id}}
        output: {{type: order.paid}}
  sink: {{kafka: {{topic: {sink}}}}}
{delivery}  serving: {{replicas: 1, batch: {{max_size: 2000}}}}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--emit",
        choices=("every", "first", "latest"),
        default="every",
        help="the join's emit mode (one payment per order: each emits every pair once)",
    )
    ap.add_argument(
        "--redis-cluster",
        action="store_true",
        help="Compare the join's and dedupe's state operations on a three-master Redis "
        "Cluster with one Redis (benchmarks/_join_cluster.py) instead.",
    )
    args = ap.parse_args()
    n = args.pairs
    work = Path(tempfile.mkdtemp(prefix="eb-join-bench-"))
    if args.redis_cluster:
        from _join_cluster import compare

        print(json.dumps(compare(n, args.rounds)))
        return
    tansu = start_tansu(log_dir=work)
    redis = start_redis(data_dir=work / "redis")
    bootstrap = tansu.address
    counter = iter(range(10_000))

    async def topics() -> tuple[str, str, str]:
        k = next(counter)
        names = (f"orders-{k}", f"payments-{k}", f"paid-{k}")
        await create_topics(bootstrap, names, partitions=PARTITIONS)
        return names

    import ray

    from eventbus.serving import EventBusClient

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        namespace="eventbus",
        logging_level="ERROR",
        log_to_driver=False,
    )
    client = EventBusClient(None, bootstrap, redis.address)
    rates: dict[str, list[float]] = {"baseline": [], "eventbus": [], "eventbus_dedupe": []}
    try:
        for rnd in range(-1, args.rounds):  # round -1 warms Ray up, unmeasured
            o, p, s = asyncio.run(topics())
            asyncio.run(produce_pairs(bootstrap, o, p, n, rnd))
            asyncio.run(baseline(bootstrap, redis.address, o, p, s, n))
            _, span = asyncio.run(sink_span(bootstrap, s, n))
            if rnd >= 0:
                rates["baseline"].append(n / span)
            for label, delivery in (
                ("eventbus", ""),
                ("eventbus_dedupe", "  delivery: {dedupe: {window_s: 600}}\n"),
            ):
                o, p, s = asyncio.run(topics())
                asyncio.run(produce_pairs(bootstrap, o, p, n, rnd))
                name = f"joinbench{next(counter)}"
                path = work / f"{name}.yaml"
                path.write_text(
                    PIPELINE.format(
                        name=name, orders=o, payments=p, sink=s, delivery=delivery, emit=args.emit
                    )
                )
                client.deploy(path)
                _, span = asyncio.run(sink_span(bootstrap, s, n))
                client.delete(name)
                if rnd >= 0:
                    rates[label].append(n / span)
            if rnd >= 0:
                print(
                    f"round {rnd}: "
                    + ", ".join(f"{k} {v[-1]:,.0f} pairs/s" for k, v in rates.items()),
                    flush=True,
                )
    finally:
        ray.shutdown()
        tansu.stop()
        redis.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        json.dumps(
            {
                "benchmark": "join",
                "emit": args.emit,
                "pairs": n,
                "rounds": args.rounds,
                "baseline_pairs_per_s": round(med["baseline"]),
                "eventbus_pairs_per_s": round(med["eventbus"]),
                "eventbus_dedupe_pairs_per_s": round(med["eventbus_dedupe"]),
                "ratio": round(med["eventbus"] / med["baseline"], 3),
                "ratio_with_dedupe": round(med["eventbus_dedupe"] / med["baseline"], 3),
                "all_rates": {k: [round(x) for x in v] for k, v in rates.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
