"""EventBus against what a user would pick instead, on the same events and the same broker.

The pipeline of ``kafka_pipeline.py`` (keep ``payment.created`` with amount > 100 in CNY/USD,
add ``amount_cny``, retype to ``payment.large``, write to a sink topic), run by:

* EventBus with 1 and with 2 replicas (Ray Serve, as ``kafka_pipeline.py`` deploys it);
* Quix Streams, Bytewax (its Kafka connector) and Faust (faust-streaming), each written as its
  documentation shows (``peer_apps/``), each in a venv of its own under ``.venv-bench``;
* the hand-written loops: aiokafka (``kafka_pipeline.py``'s baseline) and confluent-kafka.

Throughput: each round pre-produces ``--events`` events on a fresh topic, starts the system,
and times the first to the last output by the wall clock at the sink (``_peer_systems.py``);
events/s is the median of the rounds, which run the systems in turn so that the machine's
noise spreads over all of them. Every round's outputs are read back and checked (count,
converted amount, new type). Latency: the system is started on fresh topics, probed until it
answers, then fed at half of its own median maximum; a tail consumer takes produce time →
arrival by the wall clock, p50/p99. A system that cannot run here is reported with its error.

Every system runs on one broker the benchmark starts: ``--broker kafka`` (Apache Kafka, one
KRaft node, the default) or ``--broker tansu`` (the embedded Tansu broker; ``_broker.py``).

Last line: one JSON object with every figure, EventBus's ratios to each system, and ``broker``.

Run: ``.venv/bin/python benchmarks/peers.py [--broker kafka|tansu] [--events 100000] [--rounds 3]
[--only quixstreams,eventbus_1]``
(``make bench`` installs the peers first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _peer_windows as windows
from _broker import add_broker_arg, start_broker
from _common import PARTITIONS, expected_outputs, pct, produce_all, start_eventbus
from _peer_systems import (
    FRAMEWORKS,
    LOOPS,
    PROCESS_PEERS,
    PeerError,
    Systems,
    measured_latency,
    pids,
    read_clock,
    start_clock,
    verify_sink,
    wait_ready,
)
from _profile import finish, record, render

from eventbus._internal.redis_service import start_redis
from eventbus._internal.services import create_topics

SYSTEMS = ("eventbus_1", "eventbus_2", *PROCESS_PEERS)
SCENARIOS = ("filter_convert", "tumbling_count")


def requirement_pins() -> dict[str, str]:
    pins = {}
    for req in sorted((Path(__file__).parent / "peer_apps").glob("requirements-*.txt")):
        for line in req.read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                name, version = line.split("==")
                pins[name] = version
    return pins


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    rate = {k: v.get("events_per_s") for k, v in results.items()}
    p99 = {k: v.get("p99_ms") for k, v in results.items()}
    ratios = {
        f"{eb}_vs_{other}": ratio(rate.get(eb), rate.get(other))
        for eb in ("eventbus_1", "eventbus_2")
        for other in results
        if not other.startswith("eventbus")
    }
    frameworks = [rate[k] for k in FRAMEWORKS if rate.get(k)]
    loops = [rate[k] for k in LOOPS if rate.get(k)]
    eb_best = max((rate[k] for k in ("eventbus_1", "eventbus_2") if rate.get(k)), default=None)
    fw_best = max(frameworks, default=None)
    fw_p99 = min((p99[k] for k in FRAMEWORKS if p99.get(k) is not None), default=None)
    loop_best = max(loops, default=None)
    targets = {
        "eventbus_vs_best_framework": ratio(eb_best, fw_best),
        "eventbus_vs_best_framework_target": 2.0,
        "eventbus_1_p99_ms": p99.get("eventbus_1"),
        "best_framework_p99_ms": fw_p99,
        "eventbus_1_vs_best_loop": ratio(rate.get("eventbus_1"), loop_best),
        "eventbus_1_vs_best_loop_target": 0.9,
        "eventbus_2_vs_best_loop": ratio(rate.get("eventbus_2"), loop_best),
        "eventbus_2_vs_best_loop_target": 1.2,
        "eventbus_1_p99_target_ms": 30,
    }
    return {
        "events": args.events,
        "outputs_per_round": expected_outputs(args.events),
        "systems": results,
        "ratios": ratios,
        "targets": targets,
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| system | events/s (median) | rounds | p50 ms | p99 ms | at events/s |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        if "error" in r and not r.get("events_per_s"):
            lines.append(f"| {name} | error: {r['error'][:120]} | | | | |")
            continue
        rounds = ", ".join(f"{x / 1000:.1f}k" for x in r.get("rates", []))
        at = f"{r['latency_rate']:,}" if "latency_rate" in r else "-"
        lines.append(
            f"| {name} | {r['events_per_s']:,} | {rounds} | {r.get('p50_ms', '-')} | "
            f"{r.get('p99_ms', '-')} | {at} |"
        )
    return "\n".join(lines)


class Bench:
    """One broker (and Ray, for EventBus) and the rounds run on it."""

    def __init__(self, args: argparse.Namespace, only: list[str]) -> None:
        self.args, self.n = args, args.events
        self.expect = expected_outputs(self.n)
        self.work = Path(tempfile.mkdtemp(prefix="eb-peers-"))
        self.broker = start_broker(args.broker, self.work)
        try:
            self.redis = start_redis(data_dir=self.work / "redis")
        except BaseException:
            self.broker.stop()
            raise
        self.bootstrap = self.broker.bootstrap
        self.client = None
        if any(s.startswith("eventbus") for s in only):
            self.client = start_eventbus(self.bootstrap, self.redis.address)
        self.systems = Systems(self.bootstrap, self.work, self.client)
        self._topics = iter(range(100_000))
        self.partial: set[str] = set()  # systems with rounds cut at --round-timeout-s
        self.window_events = windows.make_events(self.n)
        self.window_answer = windows.answer(self.window_events)

    def close(self) -> None:
        if self.client is not None:
            import ray

            ray.shutdown()
        self.broker.stop()
        self.redis.stop()

    def topics(self, partitions: int = PARTITIONS) -> tuple[str, str]:
        k = next(self._topics)
        src, sink = f"peers-in-{k}", f"peers-out-{k}"
        asyncio.run(create_topics(self.bootstrap, [src, sink], partitions=partitions))
        return src, sink

    def window_throughput(self, name: str) -> float:
        """Events/s of one tumbling-count round; every window's count is checked after."""
        src, sink = self.topics(partitions=1)
        asyncio.run(windows.produce(self.bootstrap, src, self.window_events))
        expect = len(self.window_answer)
        timeout_s = self.args.round_timeout_s
        clock = start_clock(self.bootstrap, sink, expect, timeout_s, partitions=1)
        try:
            run = self.systems.start(name, src, sink, "tumbling_count")
        except BaseException:
            clock.kill()
            raise
        try:
            first, last, count = read_clock(clock, run, expect)
        finally:
            self.systems.stop(run)
        cut = count < expect
        if cut:
            self.partial.add(f"tumbling_count:{name}")
        answer = self.window_answer
        asyncio.run(windows.verify(self.bootstrap, sink, answer, name, cut=cut))
        return windows.busy_events(self.n, name) * count / expect / max(last - first, 1e-3)

    def throughput(self, name: str) -> float:
        """Events/s of one round over pre-produced events; the outputs are checked after."""
        src, sink = self.topics()
        asyncio.run(produce_all(self.bootstrap, src, self.n))
        clock = start_clock(self.bootstrap, sink, self.expect, self.args.round_timeout_s)
        try:
            run = self.systems.start(name, src, sink)
        except BaseException:
            clock.kill()
            raise
        try:
            first, last, count = read_clock(clock, run, self.expect)
        finally:
            self.systems.stop(run)
        partial = count < self.expect
        if partial:  # cut at --round-timeout-s: outputs are spread evenly over the inputs
            self.partial.add(f"filter_convert:{name}")
        at_least = count if partial else None
        asyncio.run(verify_sink(self.bootstrap, sink, self.expect, name, at_least=at_least))
        return self.n * count / self.expect / max(last - first, 1e-3)

    def latency(self, name: str, rate: float) -> dict[str, Any]:
        src, sink = self.topics()
        run = self.systems.start(name, src, sink)
        try:
            seconds = self.args.latency_seconds
            lat = asyncio.run(measured_latency(self.bootstrap, src, sink, run, rate, seconds))
        finally:
            self.systems.stop(run)
        return {
            "latency_rate": round(rate),
            "p50_ms": round(pct(lat, 0.5), 1),
            "p99_ms": round(pct(lat, 0.99), 1),
            "latency_samples": len(lat),
            "latency_expected": int(rate * self.args.latency_seconds) // 2,
        }

    def profile(self, name: str, out: Path) -> str:
        """py-spy over the system's processes while it runs ``--events`` events at full speed."""
        src, sink = self.topics()
        run = self.systems.start(name, src, sink)
        try:
            probes = asyncio.run(wait_ready(self.bootstrap, src, sink, run))
            clock = start_clock(self.bootstrap, sink, self.expect + probes)
            spies = [(pid, record(pid, out / f"{name}-{pid}.raw")) for pid in pids(run)]
            asyncio.run(produce_all(self.bootstrap, src, self.n))
            first, last, _ = read_clock(clock, run, self.expect + probes)
            for _, spy in spies:
                finish(spy)
        finally:
            self.systems.stop(run)
        rate = f"{self.n / max(last - first, 1e-3):,.0f} events/s while sampled"
        return "\n\n".join(
            render(f"{name}, process {pid} ({rate})", out / f"{name}-{pid}.raw") for pid, _ in spies
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000, help="events per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-seconds", type=float, default=8.0)
    ap.add_argument(
        "--round-timeout-s",
        type=float,
        default=40.0,
        help="a round of a slower system is cut here and timed over the outputs so far",
    )
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(SYSTEMS)}")
    ap.add_argument(
        "--scenario",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of: {', '.join(SCENARIOS)} (tumbling_count runs "
        f"{', '.join(windows.SYSTEMS)} of --only)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a folder: instead of measuring, py-spy each system (its top frames go there)",
    )
    add_broker_arg(ap)
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s] or list(SYSTEMS)
    unknown = sorted(set(only) - set(SYSTEMS))
    if unknown:
        ap.error(f"--only: unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")
    scenarios = [s for s in args.scenario.split(",") if s]
    if not scenarios or set(scenarios) - set(SCENARIOS):
        ap.error(f"--scenario: got {args.scenario!r}; choose from {', '.join(SCENARIOS)}")
    # SIGTERM (and SIGINT, which background shells ignore) unwind: Ray, the broker, Redis
    # and the peers' processes are stopped by the `finally`s
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    bench = Bench(args, only)
    out: dict[str, Any] = {
        "benchmark": "peers",
        "broker": args.broker,
        "scenarios": scenarios,
        "rounds": args.rounds,
        "versions": requirement_pins(),
    }
    try:
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            for name in only:
                text = bench.profile(name, args.profile)
                (args.profile / f"{name}.md").write_text(text + "\n")
                print(text, flush=True)
            return
        if "filter_convert" in scenarios:
            results = measure(bench, only, bench.throughput, "filter_convert")
            print(table(results), flush=True)
            out["filter_convert"] = report(results, args)
        in_windows = [s for s in only if s in windows.SYSTEMS]
        if "tumbling_count" in scenarios and in_windows:
            results = measure(bench, in_windows, bench.window_throughput, "tumbling_count")
            print(table(results), flush=True)
            out["tumbling_count"] = windows.report(results, args.events)
    finally:
        bench.close()
    # the machine's load (1-minute average) when the run ended: on a shared 2-core machine a
    # system with more threads gets a larger share of the CPU as the load grows
    out["load_average_1m"] = round(os.getloadavg()[0], 1)
    print(json.dumps(out))


def measure(
    bench: Bench, only: list[str], one_round: Callable[[str], float], scenario: str
) -> dict[str, dict[str, Any]]:
    """``--rounds`` rounds of ``one_round`` over ``only`` in turn; then, for ``filter_convert``,
    each system's latency at half of its median rate."""
    rates: dict[str, list[float]] = {s: [] for s in only}
    results: dict[str, dict[str, Any]] = {s: {} for s in only}
    if bench.client is not None and any(s.startswith("eventbus") for s in only):
        # Ray's agents settle after start: one unmeasured round
        one_round(next(s for s in only if s.startswith("eventbus")))
    for rnd in range(bench.args.rounds):
        for name in only:
            if "error" in results[name]:
                continue
            try:
                rates[name].append(one_round(name))
            except (PeerError, RuntimeError, OSError) as e:
                results[name]["error"] = f"{type(e).__name__}: {e}"
                print(f"{scenario} {name}: cannot run: {results[name]['error']}", flush=True)
                continue
            print(f"{scenario} round {rnd}: {name} {rates[name][-1]:,.0f} events/s", flush=True)
    for name in only:
        if not rates[name]:
            continue
        results[name]["events_per_s"] = round(statistics.median(rates[name]))
        results[name]["rates"] = [round(x) for x in rates[name]]
        if f"{scenario}:{name}" in bench.partial:
            results[name]["cut_at_s"] = bench.args.round_timeout_s
        if "error" in results[name] or scenario != "filter_convert":
            continue  # a later round failed, or windows: latency is the window's length
        try:
            results[name].update(bench.latency(name, statistics.median(rates[name]) / 2))
        except (PeerError, RuntimeError, OSError) as e:
            results[name]["latency_error"] = f"{type(e).__name__}: {e}"
            continue
        r = results[name]
        print(
            f"latency {name} at {r['latency_rate']:,}/s: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms"
        )
    return results


if __name__ == "__main__":
    main()
