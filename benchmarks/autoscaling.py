"""Autoscaling under a daily cycle, compressed: the reactive policy (baseline) against the
predictive one (Holt-Winters forecast, scaling ahead), in the same run.

The load is a synthetic day compressed to ``--season-s`` seconds: a quiet night, a steep
morning ramp to a peak, a fall in the evening (rate ``lo + (hi - lo) * ((1 - cos)/2)^2``).
The pipeline's one step, ``io_wait``, waits ``--wait-ms`` per event: an I/O-bound call whose
cost is time, not CPU, so that replicas add capacity on this two-core machine. One replica
sustains ``1000 / wait_ms`` events/s; the peak needs several.

Each policy runs on its own pipeline and topics: ``--warm-seasons`` seasons (the predictive
policy needs two seasons of history before it forecasts), then ``--measure-seasons``
measured ones. Measured: end-to-end latency of every event produced in the measured window
(its produce time, carried in the event, to its arrival at a tail consumer of the sink):
p50/p99/max; and replica-seconds, the replica count (every replica Serve holds, starting and
stopping included) from ``serve.status()`` integrated over the window.

Last line: one JSON object with both policies' figures.

Run: ``.venv/bin/python benchmarks/autoscaling.py [--season-s 60] [--warm-seasons 2] [--measure-seasons 1]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault(
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "0"
)  # as `eventbus up` runs Ray
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

import eventbus  # noqa: E402
from eventbus import CloudEvent  # noqa: E402

PARTITIONS = 8


@eventbus.function(batch=True)
def io_wait(events: list[CloudEvent]) -> list[CloudEvent]:
    """Wait ``data.wait_ms`` per event (an I/O-bound call), pass the events on."""
    time.sleep(sum(float(e.data["wait_ms"]) for e in events) / 1000)
    return events


def rate_at(t: float, season_s: float, lo: float, hi: float) -> float:
    """Events/s at ``t`` seconds into the run: night at t=0, peak at half a season."""
    phase = (1 - math.cos(2 * math.pi * t / season_s)) / 2
    return lo + (hi - lo) * phase**2


def pipeline_yaml(name: str, src: str, sink: str, policy: str, args: argparse.Namespace) -> str:
    capacity = 1000 / args.wait_ms
    auto = {
        "policy": policy,
        "target_lag": capacity,  # a second of work behind per replica
        "capacity_events_per_s": capacity,
        "target_utilization": 0.8,
        "look_back_s": 3,
        "metrics_interval_s": 0.5,
        "upscale_delay_s": 0,
        "downscale_delay_s": args.season_s / 12,
        "season_s": args.season_s,
        "samples_per_season": 20,
        "lead_s": args.lead_s,
    }
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": src}}],
            "steps": [{"id": "wait", "function": "benchmarks.autoscaling:io_wait"}],
            "sink": {"kafka": {"topic": sink}},
            "serving": {
                "replicas": {"min": 1, "max": args.max_replicas},
                "batch": {"max_size": 200, "linger_ms": 5, "max_in_flight": 2},
                "autoscaling": auto,
            },
        },
    }
    return json.dumps(doc)


class ReplicaMeter:
    """Polls ``serve.status()`` on a thread: the replica count over time."""

    def __init__(self, app: str, every_s: float = 0.5) -> None:
        self.app, self.every_s = app, every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from ray import serve

        while not self._stop.is_set():
            n = 0
            try:
                app = serve.status().applications.get(self.app)
                if app is not None and "pipeline" in app.deployments:
                    n = sum(app.deployments["pipeline"].replica_states.values())
            except Exception:  # noqa: BLE001 - a missed sample; the integral bridges it
                n = self.samples[-1][1] if self.samples else 0
            self.samples.append((time.time(), n))
            self._stop.wait(self.every_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def replica_seconds(self, start: float, end: float) -> float:
        total = 0.0
        for (t0, n), (t1, _) in zip(self.samples, self.samples[1:]):
            a, b = max(t0, start), min(t1, end)
            if b > a:
                total += n * (b - a)
        return total

    def peak(self, start: float, end: float) -> int:
        return max((n for t, n in self.samples if start <= t <= end), default=0)


async def drive(
    bootstrap: str, src: str, sink: str, args: argparse.Namespace, measure: tuple[float, float]
) -> list[float]:
    """Produce the cyclic load; return the latencies (ms) of the events produced in ``measure``
    (offsets from the start of the run)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    consumer = AIOKafkaConsumer(
        sink,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="latest",
        enable_auto_commit=False,
        fetch_max_wait_ms=20,
    )
    await consumer.start()
    await consumer.seek_to_end()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=2)
    await producer.start()
    start = time.time()
    lo_t, hi_t = start + measure[0], start + measure[1]
    lat: list[float] = []
    expected = [0]
    measured_sends: list[asyncio.Future[object]] = []
    done = asyncio.Event()

    async def consume() -> None:
        while not (done.is_set() and len(lat) >= expected[0]):
            batch = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for records in batch.values():
                for r in records:
                    t0 = orjson.loads(r.value)["t0"]
                    event_id = dict(r.headers or ()).get("ce_id")
                    if (
                        lo_t <= t0 < hi_t and event_id not in seen
                    ):  # a redelivered duplicate counts once
                        seen.add(event_id)
                        lat.append((now - t0) * 1000)

    seen: set[bytes | None] = set()
    task = asyncio.create_task(consume())
    tick, sent, i = 0.05, 0.0, 0
    end = start + measure[1]
    while time.time() < end:
        t = time.time() - start
        sent += rate_at(t, args.season_s, args.lo, args.hi) * tick
        while i < int(sent):
            now = time.time()
            data = {"wait_ms": args.wait_ms, "t0": now}
            headers = [
                ("ce_specversion", b"1.0"),
                ("ce_id", f"e{i}".encode()),
                ("ce_source", b"/bench"),
                ("ce_type", b"load"),
                ("content-type", b"application/json"),
            ]
            fut = await producer.send(
                src, orjson.dumps(data), partition=i % PARTITIONS, headers=headers
            )
            if lo_t <= now < hi_t:
                expected[0] += 1
                measured_sends.append(fut)
            i += 1
        await asyncio.sleep(max(0.0, start + t + tick - time.time()))  # pacing the load generator
    await producer.flush()
    # Only events the broker acknowledged are expected at the sink.
    failed = sum(
        1
        for r in await asyncio.gather(*measured_sends, return_exceptions=True)
        if isinstance(r, BaseException)
    )
    if failed:
        print(
            f"  {failed} measured events were not acknowledged by the broker (not counted)",
            flush=True,
        )
        expected[0] -= failed
    done.set()
    try:
        await asyncio.wait_for(task, timeout=120)
    except TimeoutError:
        print(f"  {expected[0] - len(lat)} measured events not delivered within 120 s", flush=True)
    await producer.stop()
    await consumer.stop()
    return lat


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--season-s", type=float, default=60, help="one compressed day")
    parser.add_argument(
        "--warm-seasons",
        type=float,
        default=2.2,
        help="before measuring (>= 2: the forecast needs two)",
    )
    parser.add_argument("--measure-seasons", type=float, default=1)
    parser.add_argument("--lo", type=float, default=100, help="night rate, events/s")
    parser.add_argument("--hi", type=float, default=1400, help="peak rate, events/s")
    parser.add_argument("--wait-ms", type=float, default=2.0, help="I/O wait per event in the step")
    parser.add_argument(
        "--lead-s", type=float, default=15.0, help="predictive: provision this far ahead"
    )
    parser.add_argument("--max-replicas", type=int, default=5)
    parser.add_argument("--policies", default="reactive,predictive")
    args = parser.parse_args()

    import ray
    from ray import serve

    from eventbus._internal.redis_service import start_redis
    from eventbus._internal.services import create_topics, start_tansu
    from eventbus.serving import EventBusClient

    os.chdir(ROOT)  # replicas import benchmarks.autoscaling from here
    tmp = Path(tempfile.mkdtemp(prefix="eventbus-autoscale-"))
    tansu = start_tansu(log_dir=tmp)
    redis = start_redis(data_dir=tmp)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        namespace="eventbus",
        logging_level="ERROR",
        log_to_driver=False,
    )
    results: dict[str, Any] = {}
    try:
        client = EventBusClient(None, tansu.address, redis.address)
        measure = (
            args.warm_seasons * args.season_s,
            (args.warm_seasons + args.measure_seasons) * args.season_s,
        )
        for policy in args.policies.split(","):
            tag = uuid.uuid4().hex[:6]
            src, sink = f"as-in-{tag}", f"as-out-{tag}"
            asyncio.run(create_topics(tansu.address, [src, sink], partitions=PARTITIONS))
            name = f"bench-{policy}-{tag}"
            path = tmp / f"{name}.yaml"
            path.write_text(pipeline_yaml(name, src, sink, policy, args))
            client.deploy(path)
            meter = ReplicaMeter(f"eventbus-{name}")
            meter.start()
            print(
                f"{policy}: {measure[1]:.0f} s of cyclic load, measuring from {measure[0]:.0f} s",
                flush=True,
            )
            t_start = time.time()
            lat = asyncio.run(drive(tansu.address, src, sink, args, measure))
            meter.stop()
            lo_t, hi_t = t_start + measure[0], t_start + measure[1]
            results[policy] = {
                "events": len(lat),
                "p50_ms": round(pct(lat, 0.50), 1),
                "p99_ms": round(pct(lat, 0.99), 1),
                "max_ms": round(max(lat, default=float("nan")), 1),
                "replica_seconds": round(meter.replica_seconds(lo_t, hi_t), 1),
                "peak_replicas": meter.peak(lo_t, hi_t),
            }
            print(f"  {policy}: {results[policy]}", flush=True)
            client.delete(name)
    finally:
        serve.shutdown()
        ray.shutdown()
        redis.stop()
        tansu.stop()
    out: dict[str, Any] = {
        "benchmark": "autoscaling",
        "season_s": args.season_s,
        "measured_s": args.measure_seasons * args.season_s,
        "load_events_per_s": [args.lo, args.hi],
        "replica_capacity_events_per_s": 1000 / args.wait_ms,
        **results,
    }
    if "reactive" in results and "predictive" in results:
        r, p = results["reactive"], results["predictive"]
        out["p99_ratio_predictive_vs_reactive"] = (
            round(p["p99_ms"] / r["p99_ms"], 3) if r["p99_ms"] else None
        )
        out["replica_seconds_ratio_predictive_vs_reactive"] = (
            round(p["replica_seconds"] / r["replica_seconds"], 3) if r["replica_seconds"] else None
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
