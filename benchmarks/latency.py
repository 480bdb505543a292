"""End-to-end latency of the peers' pipeline at a few rates, and where it goes.

Issue 24's target: p99 ≤ 30 ms at half of EventBus's maximum rate. This runs ``peers.py``'s
filter/convert pipeline on one broker and one Ray cluster: EventBus's maximum first (median of
``--rounds`` rounds over pre-produced events, as ``peers.py`` times it), then, at each
``--fractions`` of it, EventBus with 1 replica under each ``--settings`` (the source's
``batch.linger_ms`` / ``fetch_max_wait_ms``) and the confluent-kafka loop, in turn. Each
output's latency is split at its record timestamp (EventBus's producer stamps it when it
appends the record, as librdkafka does): **to producer** (fetch wait, batching, decode, steps,
encode) and **to tail** (the produce request, the broker, the tail consumer's fetch).

Last line: one JSON object with p50/p99 of each (system, rate) and of both parts, the
EventBus/loop p99 ratio at each rate, and the 1-minute load average before and after each
measurement (on a shared machine every figure moves with it), and where the machine's CPU went
while each was measured (``cpu_pct_of_one_core``: the load generator and tail consumer, which
share this process; the broker; the replica or the loop; Redis; Ray's other processes; anything
else on the machine; and the machine's busy share, of ``cores`` cores).

It runs on one broker it starts: ``--broker kafka`` (Apache Kafka, one KRaft node, the default)
or ``--broker tansu`` (the embedded Tansu broker; ``_broker.py``); the JSON names it (``broker``).

Run: ``.venv/bin/python benchmarks/latency.py [--broker kafka|tansu] [--fractions 0.1,0.25,0.5]
[--settings 2/10,0/2]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Collection
from typing import Any

import psutil
from _broker import add_broker_arg
from _common import latency_run, pct
from _peer_systems import Running, wait_ready
from peers import Bench

PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources: [{{kafka: {{topic: {src}, fetch_max_wait_ms: {fetch_wait}}}}}]
  steps:
    - id: only_large
      filter: "type == 'payment.created' && data.amount > 100 && data.currency in ['CNY', 'USD']"
    - id: to_cny
      convert: {{set: {{data.amount_cny: "double(data.amount) * 7.1", type: "'payment.large'"}}}}
  sink: {{kafka: {{topic: {sink}}}}}
  serving: {{replicas: 1, batch: {{max_size: 2000, linger_ms: {linger}}}}}
"""


def summary(lat: list[float], stages: list[tuple[float, float]], rate: float) -> dict[str, Any]:
    to_producer = [a for a, _ in stages]
    to_tail = [b for _, b in stages]
    return {
        "rate": round(rate),
        "samples": len(lat),
        "p50_ms": round(pct(lat, 0.5), 1),
        "p99_ms": round(pct(lat, 0.99), 1),
        "to_producer_p50_ms": round(pct(to_producer, 0.5), 1),
        "to_producer_p99_ms": round(pct(to_producer, 0.99), 1),
        "to_tail_p50_ms": round(pct(to_tail, 0.5), 1),
        "to_tail_p99_ms": round(pct(to_tail, 0.99), 1),
    }


def _cpu_role(p: psutil.Process, cmd: str, broker_pids: Collection[int]) -> str:
    if p.pid == os.getpid():
        return "generator_and_tail"  # this process: the load generator and the tail consumer
    if p.pid in broker_pids:
        return "broker"  # Apache Kafka's JVM; Tansu (and its stunnel4 with --tls)
    for key, role in (
        ("ServeReplica", "replica"),
        ("redis-server", "redis"),
        ("tail_clock", "generator_and_tail"),
        ("peer_apps", "loop"),
        ("ray", "ray_other"),
    ):
        if key in cmd:
            return role
    return "other"  # the rest of the machine: other jobs on a shared machine


def cpu_snapshot(
    broker_pids: Collection[int] = (),
) -> tuple[float, float, dict[int, tuple[str, float]]]:
    """(wall time, machine busy CPU seconds, {pid: (role, CPU seconds)}); ``broker_pids``:
    the broker's processes."""
    procs: dict[int, tuple[str, float]] = {}
    for p in psutil.process_iter(["cmdline", "name"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [p.info["name"] or ""])
            t = p.cpu_times()
            procs[p.pid] = (_cpu_role(p, cmd, broker_pids), t.user + t.system)
        except psutil.Error:
            continue
    m = psutil.cpu_times()
    busy = m.user + m.nice + m.system + getattr(m, "irq", 0) + getattr(m, "softirq", 0)
    return time.monotonic(), busy, procs


def cpu_split(
    before: tuple[float, float, dict[int, tuple[str, float]]],
    after: tuple[float, float, dict[int, tuple[str, float]]],
) -> dict[str, float]:
    """Each role's CPU between two snapshots, in % of one core, and the machine's busy %."""
    wall = after[0] - before[0]
    out: dict[str, float] = {}
    for pid, (role, t) in after[2].items():
        prev = before[2].get(pid)
        used = t - prev[1] if prev is not None and prev[0] == role else t
        out[role] = out.get(role, 0.0) + used
    split = {k: round(100 * v / wall, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
    split["machine_busy"] = round(100 * (after[1] - before[1]) / wall, 1)
    split["cores"] = psutil.cpu_count()
    return split


def measure(bench: Bench, label: str, run_start: Any, rate: float) -> dict[str, Any]:
    src, sink = bench.topics()
    load_before = os.getloadavg()[0]
    run: Running = run_start(src, sink)
    stages: list[tuple[float, float]] = []
    cpu: dict[str, float] = {}
    try:

        async def go() -> list[float]:
            await wait_ready(bench.bootstrap, src, sink, run)
            seconds = bench.args.latency_seconds
            before = cpu_snapshot(bench.broker.pids)
            lat = await latency_run(bench.bootstrap, src, sink, rate, seconds, stages)
            cpu.update(cpu_split(before, cpu_snapshot(bench.broker.pids)))
            return lat

        lat = asyncio.run(go())
    finally:
        bench.systems.stop(run)
    out = summary(lat, stages, rate)
    out["load_average_1m"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    out["cpu_pct_of_one_core"] = cpu
    print(f"{label} at {rate:,.0f}/s: {out}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000, help="events per maximum round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of EventBus's maximum")
    ap.add_argument("--latency-seconds", type=float, default=8.0)
    ap.add_argument("--fractions", default="0.1,0.25,0.5", help="rates, as parts of the maximum")
    ap.add_argument(
        "--settings",
        default="2/10",
        help="EventBus variants, comma-separated LINGER_MS/FETCH_MAX_WAIT_MS (2/10: the defaults)",
    )
    ap.add_argument("--round-timeout-s", type=float, default=40.0)
    add_broker_arg(ap)
    args = ap.parse_args()
    try:
        fractions = [float(f) for f in args.fractions.split(",")]
        variants = [(int(a), int(b)) for a, b in (v.split("/") for v in args.settings.split(","))]
    except ValueError:
        ap.error(
            f"--fractions {args.fractions!r} / --settings {args.settings!r}: expected numbers "
            "like 0.1,0.5 and LINGER_MS/FETCH_MAX_WAIT_MS pairs like 2/10,0/2"
        )
    if not all(0 < f <= 1 for f in fractions):
        ap.error(f"--fractions {args.fractions!r}: each a part of the maximum, in (0, 1]")
    bench = Bench(args, ["eventbus_1", "confluent_loop"])
    results: dict[str, Any] = {}
    try:
        bench.throughput("eventbus_1")  # Ray's agents settle after start: unmeasured
        rates = [bench.throughput("eventbus_1") for _ in range(args.rounds)]
        top = statistics.median(rates)
        print(f"eventbus_1 maximum: {top:,.0f} events/s (rounds {rates})", flush=True)
        results["eventbus_1_max_events_per_s"] = round(top)
        results["eventbus_1_max_rounds"] = [round(r) for r in rates]
        for fraction in fractions:
            rate = top * fraction
            at: dict[str, Any] = {}
            for linger, fetch_wait in variants:
                label = f"eventbus_1 linger {linger} ms, fetch wait {fetch_wait} ms"

                def deploy(
                    src: str, sink: str, linger: int = linger, wait: int = fetch_wait
                ) -> Running:
                    bench.systems._n += 1
                    name = f"latency{bench.systems._n}"
                    path = bench.work / f"{name}.yaml"
                    yaml = PIPELINE.format(
                        name=name, src=src, sink=sink, linger=linger, fetch_wait=wait
                    )
                    path.write_text(yaml)
                    bench.client.deploy(path)
                    return Running("eventbus_1", pipeline=name)

                at[f"eventbus_1_{linger}_{fetch_wait}"] = measure(bench, label, deploy, rate)
            at["confluent_loop"] = measure(
                bench,
                "confluent_loop",
                lambda src, sink: bench.systems.start("confluent_loop", src, sink),
                rate,
            )
            for key, r in at.items():
                if key.startswith("eventbus"):
                    loop_p99 = at["confluent_loop"]["p99_ms"]
                    r["p99_vs_loop"] = round(r["p99_ms"] / loop_p99, 3) if loop_p99 else None
            results[f"at_{fraction}_of_max"] = at
    finally:
        bench.close()
    results["p99_target_ms"] = 30
    print(
        json.dumps(
            {"benchmark": "latency", "broker": args.broker, "events": args.events, **results}
        )
    )


if __name__ == "__main__":
    main()
