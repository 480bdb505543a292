"""Many models in one multiplexed pool (issue 40): N small MLPs generated here, Zipf traffic
over them through one pipeline whose model step picks each event's model by CEL.

The benchmark writes N MLPs (16 → hidden → hidden → 1, a few MB each at the default
``--hidden 512``) into the model registry, deploys one pipeline with a pool of
``--per-replica`` models per replica, and produces ``--events`` events at ``--rate`` events/s
whose model is drawn from a Zipf distribution (exponent ``--zipf``) over the models. It reports
events/s (first to last output), end-to-end p50/p99 (produce time to the output's broker
timestamp) for hot models (the 10 most called) and for cold ones (the rest), each model's
first answer (a load), the pool's loads and evictions (from the pipeline's status), and the
resident memory of this process's Ray cluster (every process of it) at the end.

Not yet measured here (the issue's comparison): one application per model for as many models
as fit, shadow traffic's CPU, GPU placement.

Smoke run: ``.venv/bin/python benchmarks/models_many.py --models 5 --events 500 --rate 200``.
Full size (minutes, ~GBs): ``--models 300 --events 60000``. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import orjson  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402

from eventbus._internal.redis_service import start_redis  # noqa: E402
from eventbus._internal.services import create_topics, start_tansu  # noqa: E402

HOT = 10  # the most called models count as hot (at most a tenth of them)

PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources: [{{kafka: {{topic: {src}}}}}]
  model_pools: {{many: {{max_models_per_replica: {per_replica}, replicas: {replicas}}}}}
  steps:
    - id: score
      model: {{pool: many, select: "'mb-' + data.m", input: data.x, output: data.y}}
  sink: {{kafka: {{topic: {sink}}}}}
  serving: {{replicas: 1, batch: {{max_size: 500, linger_ms: 5}}}}
"""


def make_models(redis_url: str, n: int, hidden: int) -> int:
    """N MLPs as torch.export programs, each version 1 of ``mb-<i>`` (serving). Returns the
    bytes of one artifact."""
    import torch

    from eventbus.models import ModelRegistry

    reg = ModelRegistry(redis_url)
    size = 0
    for i in range(n):
        torch.manual_seed(i)
        module = torch.nn.Sequential(
            torch.nn.Linear(16, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        ).eval()
        ep = torch.export.export(
            module, (torch.zeros(2, 16),), dynamic_shapes=({0: torch.export.Dim("batch")},)
        )
        buf = io.BytesIO()
        torch.export.save(ep, buf)
        blob = buf.getvalue()
        size = len(blob)
        name = f"mb-{i:04d}"
        version = reg.add_version(name, blob, format="export", input_shape=(16,))
        reg.set_serving(name, version)
    return size


def zipf_draws(n_models: int, n_events: int, s: float, seed: int) -> np.ndarray:
    """Model index per event, Zipf over ranks (rank 0 the hottest), bounded to the models."""
    ranks = np.arange(1, n_models + 1, dtype=np.float64)
    p = ranks**-s
    return np.random.default_rng(seed).choice(n_models, size=n_events, p=p / p.sum())


def _record(i: int | str, model: int, x: list[float]) -> tuple[bytes, list[tuple[str, bytes]]]:
    data = {"m": f"{model:04d}", "x": x, "t": time.time()}
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", f"{i}".encode()),
        ("ce_source", b"/bench"),
        ("ce_type", b"req"),
        ("content-type", b"application/json"),
    ]
    return orjson.dumps(data), headers


async def warm_up(bootstrap: str, src: str, sink: str) -> None:
    """One event through the pipeline (model 0), so that the run measures a running pipeline."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        value, headers = _record("warm", 0, [0.0] * 16)
        await producer.send_and_wait(src, value, headers=headers)
    finally:
        await producer.stop()
    await collect_outputs(bootstrap, sink, 1, timeout_s=300, warm=True)


async def produce_paced(bootstrap: str, topic: str, draws: np.ndarray, rate: float) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
    await producer.start()
    try:
        rng = np.random.default_rng(1)
        start = time.monotonic()
        chunk = max(1, int(rate / 100))  # one chunk per 10 ms
        for k in range(0, len(draws), chunk):
            for i in range(k, min(k + chunk, len(draws))):
                x = rng.random(16).round(3).tolist()
                value, headers = _record(f"e{i}", int(draws[i]), x)
                await producer.send(topic, value, headers=headers)
            ahead = start + (k + chunk) / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)  # pacing the offered load
        await producer.flush()
    finally:
        await producer.stop()


async def collect_outputs(
    bootstrap: str, topic: str, n: int, timeout_s: float, *, warm: bool = False
) -> list[Any]:
    """The ``(model, sent_at, output_at)`` of ``n`` measured outputs (or the warm-up one)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bench-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < n and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for r in records:
                    if (dict(r.headers).get("ce_id") == b"warm") != warm:
                        continue
                    d = orjson.loads(r.value)
                    out.append((int(d["m"]), d["t"], r.timestamp / 1000))
    finally:
        await consumer.stop()
    return out


def cluster_rss_mb() -> float:
    """Resident memory of this process and every process it started (Ray's, the broker's)."""
    import psutil

    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a process that just ended
            total += p.memory_info().rss
    return total / 2**20


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=300)
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--rate", type=float, default=2000, help="offered events/s")
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--per-replica", type=int, default=64)
    ap.add_argument("--replicas", type=int, default=1)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eb-models-many-"))
    tansu = start_tansu(log_dir=work)
    redis = start_redis(data_dir=work / "redis")
    bootstrap = tansu.address
    src, sink = "many-in", "many-out"
    asyncio.run(create_topics(bootstrap, (src, sink), partitions=2))
    artifact = make_models(redis.address, args.models, args.hidden)
    import ray

    from eventbus.serving import EventBusClient

    ray.init(num_cpus=2, include_dashboard=False, namespace="eventbus", logging_level="ERROR")
    client = EventBusClient(None, bootstrap, redis.address)
    try:
        path = work / "many.yaml"
        path.write_text(
            PIPELINE.format(
                name="many",
                src=src,
                sink=sink,
                per_replica=args.per_replica,
                replicas=args.replicas,
            )
        )
        client.deploy(path)
        asyncio.run(warm_up(bootstrap, src, sink))
        draws = zipf_draws(args.models, args.events, args.zipf, seed=0)

        async def run() -> list[Any]:
            collector = asyncio.create_task(
                collect_outputs(bootstrap, sink, args.events, timeout_s=600)
            )
            await produce_paced(bootstrap, src, draws, args.rate)
            return await collector

        out = asyncio.run(run())
        rss = cluster_rss_mb()
        pool: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the replicas publish their figures periodically
            pool = client.status("many")["figures"].get("model_pools", {}).get("score", {})
            if pool.get("loads"):
                break
            time.sleep(0.5)
        client.delete("many")
    finally:
        ray.shutdown()
        tansu.stop()
        redis.stop()
    counts = np.bincount(draws, minlength=args.models)
    hot = set(np.argsort(-counts)[: max(1, min(HOT, args.models // 10))].tolist())
    first: dict[int, float] = {}
    lat_hot, lat_cold = [], []
    for m, sent, at in sorted(out, key=lambda r: r[2]):
        (lat_hot if m in hot else lat_cold).append(at - sent)
        first.setdefault(m, at - sent)
    span = max(r[2] for r in out) - min(r[2] for r in out) if len(out) > 1 else 0.0
    figures = {
        "benchmark": "models_many",
        "models": args.models,
        "artifact_bytes": artifact,
        "events": args.events,
        "delivered": len(out),
        "offered_events_per_s": args.rate,
        "events_per_s": round(len(out) / span) if span else None,
        "hot_p50_ms": _pct(lat_hot, 0.5),
        "hot_p99_ms": _pct(lat_hot, 0.99),
        "cold_p50_ms": _pct(lat_cold, 0.5),
        "cold_p99_ms": _pct(lat_cold, 0.99),
        "first_answer_median_ms": round(statistics.median(first.values()) * 1000, 1)
        if first
        else None,
        "pool_loads": pool.get("loads"),
        "pool_evictions": pool.get("evictions"),
        "pool_models_held": pool.get("models"),
        "rss_mb": round(rss),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
