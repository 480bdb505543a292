"""Model stage: transactions scored by the example fraud model (examples/fraud_model), EventBus
against direct batched torch calls in one process.

Both consume the same pre-produced topic on the real Tansu broker:

* baseline: one asyncio process: ``getmany(2000)`` → decode each record's JSON → one batched
  ``model(torch.tensor(rows))`` call per batch (the same torch.export program, torch threads
  pinned to 1 like a replica with ``num_cpus < 2``) → each output into its event's data →
  ``send_batch`` → acks → commit;
* EventBus: the example's pipeline shape (model step, then a convert) on a Serve replica; the
  model is its own Serve deployment (dynamic batching), called once per micro-batch.

Throughput: events per second between the first and last output record (broker timestamps),
median of rounds. Also printed: the model alone (batched torch calls, no Kafka), for scale.
Last line: one JSON object with the figures and ``ratio`` (EventBus / baseline events/s).
The device is CUDA when torch sees a GPU (both sides), else the CPU.

Run: ``.venv/bin/python benchmarks/model_stage.py [--events 50000] [--rounds 3]``
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
import time
import uuid
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault(
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "0"
)  # as `eventbus up` runs Ray
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402
from kafka_pipeline import sink_span  # noqa: E402

from eventbus._internal.redis_service import start_redis  # noqa: E402
from eventbus._internal.services import create_topics, start_tansu  # noqa: E402

PARTITIONS = 3
MODEL = ROOT / "examples/fraud_model/fraud.pt2"


async def produce_all(bootstrap: str, topic: str, n: int, seed: int) -> None:
    rnd = random.Random(seed)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=512 * 1024
    )
    await producer.start()
    try:
        futs = []
        batches = {p: producer.create_batch() for p in range(PARTITIONS)}
        for i in range(n):
            p = i % PARTITIONS
            headers = [
                ("ce_specversion", b"1.0"),
                ("ce_id", f"t{i}".encode()),
                ("ce_source", b"/cards"),
                ("ce_type", b"transaction.created"),
                ("content-type", b"application/json"),
            ]
            feats = [
                round(rnd.uniform(1, 4), 3),
                round(rnd.random(), 3),
                round(rnd.uniform(0, 3.5), 3),
                rnd.randint(0, 6) / 10,
                float(rnd.random() < 0.15),
                float(rnd.random() < 0.6),
                round(rnd.lognormvariate(0, 0.8), 3),
                float(rnd.random() < 0.1),
            ]
            value = orjson.dumps({"card": f"c{i % 997}", "features": feats})
            if batches[p].append(key=None, value=value, timestamp=None, headers=headers) is None:
                futs.append(await producer.send_batch(batches[p], topic, partition=p))
                batches[p] = producer.create_batch()
                batches[p].append(key=None, value=value, timestamp=None, headers=headers)
        for p, b in batches.items():
            futs.append(await producer.send_batch(b, topic, partition=p))
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


def load_direct() -> tuple[object, str]:
    import torch

    from eventbus.models import load_model, pick_device

    torch.set_num_threads(1)
    device = pick_device()
    return load_model(MODEL.read_bytes(), device=device), device


async def baseline(bootstrap: str, src: str, sink: str, n: int, model: object) -> None:
    import torch

    consumer = AIOKafkaConsumer(
        src,
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
    consumed = 0
    try:
        while consumed < n:
            batch = await consumer.getmany(timeout_ms=100, max_records=2000)
            if not batch:
                continue
            recs = [(tp, r) for tp, records in batch.items() for r in records]
            datas = [orjson.loads(r.value) for _, r in recs]
            scores = (
                model(torch.tensor([d["features"] for d in datas], dtype=torch.float32))
                .reshape(-1)
                .tolist()
            )  # type: ignore[operator]
            futs = []
            outs = {tp: producer.create_batch() for tp in batch}
            for (tp, r), d, s in zip(recs, datas, scores):
                consumed += 1
                d["fraud_score"] = s
                h = dict(r.headers)
                h["ce_type"] = b"transaction.scored"
                hdrs, val = list(h.items()), orjson.dumps(d)
                if outs[tp].append(key=r.key, value=val, timestamp=None, headers=hdrs) is None:
                    futs.append(await producer.send_batch(outs[tp], sink, partition=tp.partition))
                    outs[tp] = producer.create_batch()
                    outs[tp].append(key=r.key, value=val, timestamp=None, headers=hdrs)
            for tp, out in outs.items():
                if out.record_count():
                    futs.append(await producer.send_batch(out, sink, partition=tp.partition))
            await asyncio.gather(*futs)
            await consumer.commit({tp: records[-1].offset + 1 for tp, records in batch.items()})
    finally:
        await consumer.stop()
        await producer.stop()


PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources: [{{kafka: {{topic: {src}}}}}]
  steps:
    - id: score
      model: {{name: {model}, path: {path}, input: data.features, output: data.fraud_score,
               serving: {{max_batch_size: 8, batch_wait_ms: 0.5, num_cpus: 0}}}}
    - id: to_scored
      convert: {{set: {{type: "'transaction.scored'"}}}}
  sink: {{kafka: {{topic: {sink}}}}}
  serving: {{replicas: 1, batch: {{max_size: 2000, linger_ms: 2}}}}
"""


def model_alone(model: object, rows: int = 200_000, batch: int = 2000) -> float:
    import torch

    x = torch.rand(batch, 8)
    model(x)  # type: ignore[operator]
    t = time.perf_counter()
    for _ in range(rows // batch):
        model(x)  # type: ignore[operator]
    return rows / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.events
    work = Path(tempfile.mkdtemp(prefix="eb-model-bench-"))
    tansu = start_tansu(log_dir=work)
    redis = start_redis(data_dir=work / "redis")
    bootstrap = tansu.address
    counter = iter(range(10_000))

    async def topics() -> tuple[str, str]:
        k = next(counter)
        names = (f"tx-{k}", f"scored-{k}")
        await create_topics(bootstrap, names, partitions=PARTITIONS)
        return names

    model, device = load_direct()
    alone = model_alone(model)
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
    rates: dict[str, list[float]] = {"baseline": [], "eventbus": []}
    try:
        for rnd in range(-1, args.rounds):  # round -1 warms Ray and the model app up, unmeasured
            s, o = asyncio.run(topics())
            asyncio.run(produce_all(bootstrap, s, n, rnd))
            asyncio.run(baseline(bootstrap, s, o, n, model))
            _, span = asyncio.run(sink_span(bootstrap, o, n))
            if rnd >= 0:
                rates["baseline"].append(n / span)
            s, o = asyncio.run(topics())
            asyncio.run(produce_all(bootstrap, s, n, rnd))
            name = f"modelbench{next(counter)}"
            path = work / f"{name}.yaml"
            path.write_text(
                PIPELINE.format(name=name, src=s, sink=o, model="fraud-bench", path=MODEL)
            )
            client.deploy(path)
            _, span = asyncio.run(sink_span(bootstrap, o, n))
            client.delete(name)
            if rnd >= 0:
                rates["eventbus"].append(n / span)
                print(
                    f"round {rnd}: "
                    + ", ".join(f"{k} {v[-1]:,.0f} events/s" for k, v in rates.items()),
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
                "benchmark": "model_stage",
                "device": device,
                "events": n,
                "rounds": args.rounds,
                "model_alone_rows_per_s": round(alone),
                "baseline_events_per_s": round(med["baseline"]),
                "eventbus_events_per_s": round(med["eventbus"]),
                "ratio": round(med["eventbus"] / med["baseline"], 3),
                "all_rates": {k: [round(x) for x in v] for k, v in rates.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
