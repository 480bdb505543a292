"""Many models in one multiplexed pool (issue 40), against a single-model pipeline and against
one application per model, in one run.

The benchmark writes N MLPs (16 → hidden → hidden → 1, a few MB each at the default
``--hidden 512``) into the model registry (and a candidate version 2 of ``mb-0000``), then:

(a) **pool**: one pipeline with a pool of ``--per-replica`` models per replica; ``--events``
    events at ``--rate`` events/s whose model is drawn from a Zipf distribution (exponent
    ``--zipf``). Events/s (first to last output), end-to-end p50/p99 (produce time to the
    output's broker timestamp) for hot models (the 10 most called) and cold ones (the rest),
    each cold model's first answer (a load), the pool's loads and evictions, the RSS/USS of the
    pool's replica processes.
(b) **single**: one pipeline calling ``mb-0000`` (its own application) at the same rate,
    ``--single-events`` events: its p99, the hot-p99 ratio's denominator.
(d) **shadow**: the same again with ``mb-0000`` version 2 shadowed at 100%; the CPU seconds of
    the Ray cluster's processes (psutil over every process ``ray.init`` started; not the
    broker, Redis or this process) per 1,000 events, with and without the shadow.
(c) **apps**: one application per model (``eventbus-model-<name>``, default settings), added
    one at a time; a model fits while its application runs within ``--apps-timeout-s`` and
    the replicas' RSS stays under ``--memory-bound-mb`` (4 GB, the pool's target); it stops
    there, at ``--apps-budget-s``, or with every model running. How many fit and their memory.

The last line is one JSON object; ``targets`` has each of the issue's targets with its figure
and ``pass``: 300 models served by the pool within 4 GB of replica RSS (fails below 300
models: not measured), hot p99 <= 1.5x the single model's, every cold model's first answer
< 1 s (the largest), shadow CPU <= 1.3x. Not measured: GPU placement.

Smoke run: ``.venv/bin/python benchmarks/models_many.py --models 5 --events 500 --rate 200``.
``make bench``: ``--models 100 --events 20000 --rate 1000`` (minutes). Full size (~GBs):
``--models 300 --events 60000``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
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

sys.path.insert(0, str(ROOT / "benchmarks"))
from _models_measure import (  # noqa: E402
    apps_phase,
    cpu_seconds,
    cpu_spent,
    pct,
    replica_memory_mb,
    targets,
)

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

SINGLE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: single}}
spec:
  sources: [{{kafka: {{topic: {src}}}}}]
  steps:
    - id: score
      model: {{name: mb-0000, input: data.x, output: data.y}}
  sink: {{kafka: {{topic: {sink}}}}}
  serving: {{replicas: 1, batch: {{max_size: 500, linger_ms: 5}}}}
"""


def _mlp_blob(seed: int, hidden: int) -> bytes:
    """An MLP (16 → hidden → hidden → 1) as a torch.export program."""
    import torch

    torch.manual_seed(seed)
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
    return buf.getvalue()


def make_models(redis_url: str, n: int, hidden: int) -> int:
    """N MLPs, each version 1 of ``mb-<i>`` (serving), and a candidate version 2 of
    ``mb-0000`` (the shadow's). Returns the bytes of one artifact."""
    from eventbus.models import ModelRegistry

    reg = ModelRegistry(redis_url)
    size = 0
    for i in range(n):
        blob = _mlp_blob(i, hidden)
        size = len(blob)
        name = f"mb-{i:04d}"
        version = reg.add_version(name, blob, format="export", input_shape=(16,))
        reg.set_serving(name, version)
    reg.add_version("mb-0000", _mlp_blob(10_000, hidden), format="export", input_shape=(16,))
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
        value, headers = _record(f"warm-{src}", 0, [0.0] * 16)
        await producer.send_and_wait(src, value, headers=headers)
    finally:
        await producer.stop()
    await collect_outputs(bootstrap, sink, 1, timeout_s=300, tag=f"warm-{src}")


async def produce_paced(
    bootstrap: str, topic: str, draws: np.ndarray, rate: float, tag: str
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
    await producer.start()
    try:
        rng = np.random.default_rng(1)
        start = time.monotonic()
        chunk = max(1, int(rate / 100))  # one chunk per 10 ms
        for k in range(0, len(draws), chunk):
            for i in range(k, min(k + chunk, len(draws))):
                x = rng.random(16).round(3).tolist()
                value, headers = _record(f"{tag}{i}", int(draws[i]), x)
                await producer.send(topic, value, headers=headers)
            ahead = start + (k + chunk) / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)  # pacing the offered load
        await producer.flush()
    finally:
        await producer.stop()


async def collect_outputs(
    bootstrap: str, topic: str, n: int, timeout_s: float, *, tag: str
) -> list[Any]:
    """The ``(model, sent_at, output_at)`` of ``n`` outputs whose event id starts with ``tag``
    (one phase's events; a topic serves several)."""
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
                    if not (dict(r.headers).get("ce_id") or b"").startswith(tag.encode()):
                        continue
                    d = orjson.loads(r.value)
                    out.append((int(d["m"]), d["t"], r.timestamp / 1000))
    finally:
        await consumer.stop()
    return out


def run_phase(
    bootstrap: str, src: str, sink: str, draws: np.ndarray, rate: float, tag: str, others: set[int]
) -> tuple[list[Any], float]:
    """``draws`` as events at ``rate`` through a deployed pipeline: its outputs and the CPU
    seconds the Ray cluster's processes spent from the first event produced to the last
    output read."""

    async def run() -> list[Any]:
        collector = asyncio.create_task(
            collect_outputs(bootstrap, sink, len(draws), timeout_s=600, tag=tag)
        )
        await produce_paced(bootstrap, src, draws, rate, tag)
        return await collector

    before = cpu_seconds(others)
    out = asyncio.run(run())
    return out, cpu_spent(before, cpu_seconds(others))


def deploy(client: Any, bootstrap: str, path: Path, text: str, src: str, sink: str) -> None:
    """Deploy the pipeline ``text`` and pass one event through it."""
    path.write_text(text)
    client.deploy(path)
    asyncio.run(warm_up(bootstrap, src, sink))


def pool_phase(
    client: Any, bootstrap: str, work: Path, args: Any, others: set[int]
) -> dict[str, Any]:
    """(a) Zipf traffic over the models through one pipeline with a multiplexed pool."""
    from eventbus.models._pool import POOL_APP_PREFIX

    src, sink = "many-in", "many-out"
    text = PIPELINE.format(
        name="many", src=src, sink=sink, per_replica=args.per_replica, replicas=args.replicas
    )
    deploy(client, bootstrap, work / "many.yaml", text, src, sink)
    draws = zipf_draws(args.models, args.events, args.zipf, seed=0)
    out, cpu = run_phase(bootstrap, src, sink, draws, args.rate, "pool-", others)
    memory = replica_memory_mb(POOL_APP_PREFIX)
    pool: dict[str, Any] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the replicas publish their figures periodically
        pool = client.status("many")["figures"].get("model_pools", {}).get("score", {})
        if pool.get("loads"):
            break
        time.sleep(0.5)
    client.delete("many")
    counts = np.bincount(draws, minlength=args.models)
    hot = set(np.argsort(-counts)[: max(1, min(HOT, args.models // 10))].tolist())
    first: dict[int, float] = {}
    lat_hot, lat_cold = [], []
    for m, sent, at in sorted(out, key=lambda r: r[2]):
        (lat_hot if m in hot else lat_cold).append(at - sent)
        first.setdefault(m, at - sent)
    cold_first = [v for m, v in first.items() if m not in hot]
    span = max(r[2] for r in out) - min(r[2] for r in out) if len(out) > 1 else 0.0
    return {
        "delivered": len(out),
        "events_per_s": round(len(out) / span) if span else None,
        "hot_p50_ms": pct(lat_hot, 0.5),
        "hot_p99_ms": pct(lat_hot, 0.99),
        "cold_p50_ms": pct(lat_cold, 0.5),
        "cold_p99_ms": pct(lat_cold, 0.99),
        "cold_first_answer_p50_ms": pct(cold_first, 0.5),
        "cold_first_answer_max_ms": pct(cold_first, 1.0),
        "pool_loads": pool.get("loads"),
        "pool_evictions": pool.get("evictions"),
        "pool_models_held": pool.get("models"),
        "pool_replica_rss_mb": memory["rss_mb"],
        "pool_replica_uss_mb": memory["uss_mb"],
        "pool_replica_processes": memory["replicas"],
        "pool_cpu_s_per_1k": round(cpu / len(out) * 1000, 3) if out else None,
    }


def single_phase(
    client: Any, bootstrap: str, work: Path, args: Any, others: set[int]
) -> dict[str, Any]:
    """(b) one model (``mb-0000``, its own application) through one pipeline at the same rate,
    then (d) the same traffic with a shadow of version 2 at 100%: p99 and CPU per 1,000."""
    src, sink = "single-in", "single-out"
    deploy(client, bootstrap, work / "single.yaml", SINGLE.format(src=src, sink=sink), src, sink)
    draws = np.zeros(args.single_events, dtype=np.int64)
    base, cpu_base = run_phase(bootstrap, src, sink, draws, args.rate, "base-", others)
    shadow = client.shadow_model("mb-0000", 2, 1.0)
    shadowed, cpu_shadow = run_phase(bootstrap, src, sink, draws, args.rate, "shadow-", others)
    time.sleep(6)  # the replica flushes its comparison every second; the status every 5 s
    row = next(r for r in client.list_models("mb-0000") if r["version"] == 2)
    client.shadow_model("mb-0000", None, 1.0)
    client.delete("single")
    per_1k = [
        round(c / max(1, len(o)) * 1000, 3) for c, o in ((cpu_base, base), (cpu_shadow, shadowed))
    ]
    figures = row.get("shadow") or {}
    return {
        "single_delivered": len(base),
        "single_p50_ms": pct([at - sent for _, sent, at in base], 0.5),
        "single_p99_ms": pct([at - sent for _, sent, at in base], 0.99),
        "shadow_mirroring": shadow.get("mirroring"),
        "shadow_delivered": len(shadowed),
        "shadow_p99_ms": pct([at - sent for _, sent, at in shadowed], 0.99),
        "shadow_rows_compared": figures.get("rows"),
        "shadow_dropped_rows": figures.get("dropped_rows"),
        "cpu_s_per_1k_no_shadow": per_1k[0],
        "cpu_s_per_1k_shadow": per_1k[1],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=300)
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--rate", type=float, default=2000, help="offered events/s")
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--per-replica", type=int, default=64)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument(
        "--single-events",
        type=int,
        help="events of the single-model runs (each; default half of --events)",
    )
    ap.add_argument(
        "--apps-max", type=int, help="per-model applications at most (default --models)"
    )
    ap.add_argument("--apps-timeout-s", type=float, default=60)
    ap.add_argument("--apps-budget-s", type=float, default=240)
    ap.add_argument("--memory-bound-mb", type=float, default=4096)
    args = ap.parse_args()
    args.single_events = args.single_events or max(1, args.events // 2)
    work = Path(tempfile.mkdtemp(prefix="eb-models-many-"))
    tansu = start_tansu(log_dir=work)
    redis = start_redis(data_dir=work / "redis")
    topics = ("many-in", "many-out", "single-in", "single-out")
    asyncio.run(create_topics(tansu.address, topics, partitions=2))
    artifact = make_models(redis.address, args.models, args.hidden)
    import ray

    from eventbus.serving import EventBusClient

    ray.init(num_cpus=2, include_dashboard=False, namespace="eventbus", logging_level="ERROR")
    client = EventBusClient(None, tansu.address, redis.address)
    others = {tansu.pid, redis.pid}  # the broker and Redis are not the Ray cluster
    figures: dict[str, Any] = {
        "benchmark": "models_many",
        "broker": "tansu",
        "models": args.models,
        "artifact_bytes": artifact,
        "events": args.events,
        "offered_events_per_s": args.rate,
        "single_events": args.single_events,
    }
    try:
        figures.update(pool_phase(client, tansu.address, work, args, others))
        figures.update(single_phase(client, tansu.address, work, args, others))
        apps_models = [f"mb-{i:04d}" for i in range(min(args.models, args.apps_max or args.models))]
        figures.update(
            apps_phase(
                redis.address,
                apps_models,
                memory_bound_mb=args.memory_bound_mb,
                deploy_timeout_s=args.apps_timeout_s,
                budget_s=args.apps_budget_s,
            )
        )
    finally:
        ray.shutdown()
        tansu.stop()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    figures["load_average"] = round(os.getloadavg()[0], 1)
    figures["targets"] = targets(figures, args.memory_bound_mb)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
