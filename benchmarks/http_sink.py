"""Kafka → HTTP subscriber: EventBus's http sink against a hand-written asyncio loop.

Both deliver the same pre-produced events (CloudEvents, Kafka binary mode, no record keys)
from the real Tansu broker to the same receiver, one event per request in the CloudEvents
HTTP binary mode, with the same number of requests in flight:

* baseline: one asyncio process: aiokafka ``getmany(2000)`` → per record an httpx POST
  (``ce-`` headers from the ``ce_`` record headers, the value as the body), at most
  ``--concurrency`` in flight → await all → commit;
* EventBus: a pipeline with no steps and ``sink: {http: {url, max_concurrency}}`` deployed on
  a local Ray cluster (the replica consumes, runs the steps, sends, commits).

The receiver is a bare ASGI app under uvicorn in a process of its own (answers 204, counts
requests and distinct ``ce-id``s, notes the first and last arrival). Throughput: events
delivered per second between the first and the last arrival, median of rounds.

Last line: one JSON object with both figures and ``ratio`` (EventBus / baseline events/s).

Run: ``.venv/bin/python benchmarks/http_sink.py [--events 20000] [--rounds 3] [--concurrency 16]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "0")  # as `eventbus up`
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import httpx
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from eventbus._internal.redis_service import start_redis
from eventbus._internal.services import create_topics, start_tansu

PARTITIONS = 3


# -- the receiver (its own process) ----------------------------------------------------------


def serve_receiver(port: int) -> None:
    import uvicorn

    state: dict[str, Any] = {"count": 0, "ids": set(), "first": None, "last": None}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        path = scope["path"]
        body = b""
        if path == "/ingest":
            now = time.time()
            for name, value in scope["headers"]:
                if name == b"ce-id":
                    state["ids"].add(value)
                    break
            state["count"] += 1
            state["first"] = state["first"] or now
            state["last"] = now
            status = 204
        elif path == "/stats":
            status = 200
            body = orjson.dumps({k: (len(v) if k == "ids" else v) for k, v in state.items()})
        elif path == "/reset":
            state.update(count=0, ids=set(), first=None, last=None)
            status = 204
        else:
            status = 404
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)


def start_receiver_process() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, "--serve-receiver", str(port)])
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{base}/stats", timeout=1).raise_for_status()
            return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)  # polling for the receiver to listen
    proc.kill()
    msg = "the receiver did not start within 30 s"
    raise RuntimeError(msg)


def receiver_stats(base: str) -> dict[str, Any]:
    return dict(httpx.get(f"{base}/stats", timeout=10).json())


def wait_delivered(base: str, n: int, timeout_s: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = receiver_stats(base)
        if stats["ids"] >= n:
            return stats
        time.sleep(0.25)  # a poll of the condition: costs the receiver one request
    msg = f"the receiver got {receiver_stats(base)['ids']} of {n} events within {timeout_s} s"
    raise RuntimeError(msg)


# -- the events ------------------------------------------------------------------------------


async def produce_all(bootstrap: str, topic: str, n: int, tag: str) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=512 * 1024
    )
    await producer.start()
    try:
        futs = []
        for part in range(PARTITIONS):
            batch = producer.create_batch()
            for i in range(part, n, PARTITIONS):
                headers = [
                    ("ce_specversion", b"1.0"),
                    ("ce_id", f"{tag}-{i}".encode()),
                    ("ce_source", b"/bench"),
                    ("ce_type", b"bench.event"),
                    ("content-type", b"application/json"),
                ]
                value = orjson.dumps({"n": i, "pad": "x" * 100})
                if batch.append(key=None, value=value, timestamp=None, headers=headers) is None:
                    futs.append(await producer.send_batch(batch, topic, partition=part))
                    batch = producer.create_batch()
                    batch.append(key=None, value=value, timestamp=None, headers=headers)
            futs.append(await producer.send_batch(batch, topic, partition=part))
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


# -- the baseline ----------------------------------------------------------------------------


async def baseline(bootstrap: str, topic: str, n: int, url: str, concurrency: int) -> None:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"baseline-{topic}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = httpx.AsyncClient(limits=limits, timeout=10.0)
    gate = asyncio.Semaphore(concurrency)
    await consumer.start()

    async def post(record: Any) -> None:
        headers = {
            ("ce-" + k[3:] if k.startswith("ce_") else k): v.decode() for k, v in record.headers
        }
        async with gate:
            while True:
                try:
                    answer = await client.post(url, content=record.value, headers=headers)
                    if answer.status_code < 300:
                        return
                except httpx.TransportError:
                    pass  # retried, as the sink retries

    done = 0
    try:
        while done < n:
            data = await consumer.getmany(timeout_ms=200, max_records=2000)
            records = [r for rs in data.values() for r in rs]
            if not records:
                continue
            await asyncio.gather(*(post(r) for r in records))
            await consumer.commit()
            done += len(records)
    finally:
        await consumer.stop()
        await client.aclose()


PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources: [{{kafka: {{topic: {src}}}}}]
  sink: {{http: {{url: "{url}", max_concurrency: {concurrency}}}}}
  serving: {{replicas: 1, batch: {{max_size: 2000}}}}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--serve-receiver", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_receiver is not None:
        serve_receiver(args.serve_receiver)
        return
    n = args.events
    work = Path(tempfile.mkdtemp(prefix="eb-bench-http-"))
    tansu = start_tansu(log_dir=work)
    redis = start_redis(data_dir=work / "redis")
    receiver, base = start_receiver_process()
    bootstrap = tansu.address
    url = f"{base}/ingest"

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
    base_rates: list[float] = []
    eb_rates: list[float] = []
    try:
        for rnd in range(-args.warmup, args.rounds):
            k = rnd + args.warmup
            src_b, src_e = f"bench-http-base-{k}", f"bench-http-eb-{k}"
            asyncio.run(create_topics(bootstrap, [src_b, src_e], partitions=PARTITIONS))

            asyncio.run(produce_all(bootstrap, src_b, n, f"b{k}"))
            httpx.post(f"{base}/reset", timeout=10)
            asyncio.run(baseline(bootstrap, src_b, n, url, args.concurrency))
            stats = wait_delivered(base, n)
            base_rate = n / (stats["last"] - stats["first"])

            asyncio.run(produce_all(bootstrap, src_e, n, f"e{k}"))
            httpx.post(f"{base}/reset", timeout=10)
            name = f"benchhttp{k}"
            path = work / f"{name}.yaml"
            path.write_text(
                PIPELINE.format(name=name, src=src_e, url=url, concurrency=args.concurrency)
            )
            client.deploy(path)
            stats = wait_delivered(base, n)
            eb_rate = n / (stats["last"] - stats["first"])
            client.delete(name)
            if rnd < 0:
                print("warm-up round done", flush=True)
                continue
            base_rates.append(base_rate)
            eb_rates.append(eb_rate)
            print(
                f"round {rnd}: baseline {base_rate:,.0f} ev/s, eventbus {eb_rate:,.0f} ev/s "
                f"(requests {stats['count']:,} for {stats['ids']:,} events)",
                flush=True,
            )
    finally:
        ray.shutdown()
        receiver.terminate()
        receiver.wait(10)
        tansu.stop()
        redis.stop()
    base_med, eb_med = statistics.median(base_rates), statistics.median(eb_rates)
    result = {
        "benchmark": "http_sink",
        "events": n,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup,
        "concurrency": args.concurrency,
        "mode": "binary",
        "baseline_events_per_s": round(base_med),
        "eventbus_events_per_s": round(eb_med),
        "ratio": round(eb_med / base_med, 3),
        "target_ratio": 0.7,
        "all_rates": {
            "baseline": [round(r) for r in base_rates],
            "eventbus": [round(r) for r in eb_rates],
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
