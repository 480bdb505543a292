"""Kafka → filter + convert → Kafka: EventBus on Ray Serve against a single-process aiokafka loop.

Both run the same pipeline (keep ``payment.created`` with amount > 100 in CNY/USD, add
``data.amount_cny``, retype) over the same pre-produced events on a real broker the benchmark
starts (``--broker kafka``: Apache Kafka, one KRaft node, the default; ``--broker tansu``: the
embedded Tansu broker; ``_broker.py``):

* baseline: one asyncio process: ``getmany(2000)`` → decode → Python filter/convert →
  encode → ``send_batch`` per partition → await acks → commit; naive, but with the fast
  produce path;
* EventBus: the pipeline deployed on a local Ray cluster (source actor → Serve replica →
  sink), CEL expressions compiled to Python.

Throughput: events consumed per second between the first and last output record (broker
timestamps of the sink records), median of rounds; the sink is read once each side is done
(EventBus: its committed count, published by the replica), so no reader runs beside either.
Latency: events produced at half of
EventBus's measured maximum rate, produce time → arrival at a tail consumer, p50/p99.

Last line: one JSON object with the figures, ``ratio`` (EventBus / baseline events/s) and
``broker``.

With ``--tls`` both sides (and the producers and tail readers of both) talk TLS to the broker
with a CA made by ``trustme``: Apache Kafka on a TLS listener of its own; Tansu behind Debian's
``stunnel4`` (``tests/fixtures/kafka_tls.py``); EventBus through the stack's Kafka client
settings (``security_protocol: SSL``, ``ca_file``); the target is a ratio of at least 0.6 to
the same loop over TLS.

With ``--guarantee exactly_once`` each round also runs the pipeline with
``delivery: {dedupe: {window_s: 600}}`` (at-least-once + Redis dedupe) and with
``delivery: {guarantee: exactly_once, commit_interval_ms: N}`` (Kafka transactions, Apache
Kafka only; ``--commit-interval-ms``, default 100), on topics of
their own, and the latency run measures all three at the same rate; ``variants`` in the JSON
holds each one's events/s, ratio to at-least-once and p50/p99 (sink readers are
``read_committed``: an exactly-once output counts at its transaction's commit).

Run: ``.venv/bin/python benchmarks/kafka_pipeline.py [--broker kafka|tansu] [--events 200000]
[--rounds 3] [--tls] [--guarantee at_least_once|exactly_once]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import _common
import redis as redis_lib
from _broker import add_broker_arg, start_broker
from _common import (
    PARTITIONS,
    PIPELINE,
    expected_outputs,
    latency_run,
    pct,
    produce_all,
    run_baseline_latency,
    sink_span,
    wait_committed,
)
from _common import (
    baseline as baseline,  # re-exported: other benchmarks import from here
)

from eventbus._internal.redis_service import start_redis
from eventbus._internal.services import create_topics

__all__ = ["sink_span"]  # join.py and model_stage.py take it from here


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unmeasured rounds first (Ray's agents settle after start)",
    )
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument(
        "--latency-rate",
        type=float,
        default=None,
        help="events/s (default: half the measured maximum)",
    )
    ap.add_argument(
        "--tls",
        action="store_true",
        help="every client over TLS (Kafka: its own TLS listener; Tansu: behind stunnel4, "
        "which needs Debian's stunnel4)",
    )
    ap.add_argument(
        "--guarantee",
        choices=["at_least_once", "exactly_once"],
        default="at_least_once",
        help="exactly_once: also run at-least-once + dedupe and exactly-once beside it",
    )
    ap.add_argument(
        "--commit-interval-ms",
        type=int,
        default=100,
        help="exactly_once: the transactions' delivery.commit_interval_ms (default 100)",
    )
    add_broker_arg(ap)
    args = ap.parse_args()
    if args.guarantee == "exactly_once" and args.broker != "kafka":
        ap.error(
            "--guarantee exactly_once needs --broker kafka (Tansu has no working transactions)"
        )
    extra = {
        "dedupe": "  delivery: {dedupe: {window_s: 600}}\n",
        "exactly_once": "  delivery: {guarantee: exactly_once, commit_interval_ms: "
        f"{args.commit_interval_ms}}}\n",
    }
    variants = ["dedupe", "exactly_once"] if args.guarantee == "exactly_once" else []
    var_rates: dict[str, list[float]] = {v: [] for v in variants}
    n = args.events
    expect = expected_outputs(n)
    work = Path(tempfile.mkdtemp(prefix="eb-bench-"))
    broker = start_broker(args.broker, work, tls=args.tls)
    kafka_client: Any = broker.client
    if kafka_client is not None:
        from eventbus.eventing._kafka_client import kafka_client_kwargs

        _common.KAFKA_KWARGS.update(kafka_client_kwargs(kafka_client))
    try:
        redis = start_redis(data_dir=work / "redis")
    except BaseException:
        broker.stop()
        raise
    bootstrap = broker.bootstrap
    counter = iter(range(10_000))

    async def topics() -> tuple[str, str]:
        k = next(counter)
        src, sink = f"bench-in-{k}", f"bench-out-{k}"
        await create_topics(bootstrap, [src, sink], partitions=PARTITIONS, client=kafka_client)
        return src, sink

    import ray

    from eventbus.serving import EventBusClient

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        namespace="eventbus",
        logging_level="ERROR",
        log_to_driver=False,
    )
    client = EventBusClient(None, bootstrap, redis.address, kafka_client=kafka_client)
    stats_redis = redis_lib.Redis.from_url(redis.address)
    base_rates, eb_rates = [], []
    try:
        for rnd in range(-args.warmup, args.rounds):
            src, sink = asyncio.run(topics())
            asyncio.run(produce_all(bootstrap, src, n))
            asyncio.run(baseline(bootstrap, src, sink, n))
            count, span = asyncio.run(sink_span(bootstrap, sink, expect))
            if rnd >= 0:
                base_rates.append(n / span)

            src, sink = asyncio.run(topics())
            asyncio.run(produce_all(bootstrap, src, n))
            path = work / f"bench-{rnd % 1000}.yaml"
            path.write_text(
                PIPELINE.format(
                    name=f"bench{rnd % 1000}", src=src, sink=sink, replicas=args.replicas
                )
            )
            client.deploy(path)
            # Wait for the pipeline's committed count (its replica publishes it to Redis every
            # second) before reading the sink: the baseline's outputs are read after it ends,
            # so a tail consumer running beside EventBus would take CPU from one side only.
            wait_committed(stats_redis, f"bench{rnd % 1000}", n)
            count, span = asyncio.run(sink_span(bootstrap, sink, expect))
            client.delete(f"bench{rnd % 1000}")
            if rnd < 0:
                print("warm-up round done", flush=True)
                continue
            eb_rates.append(n / span)
            print(
                f"round {rnd}: baseline {base_rates[-1]:,.0f} ev/s, eventbus {eb_rates[-1]:,.0f} ev/s",
                flush=True,
            )
            for v in variants:  # the same pipeline, another delivery guarantee
                src, sink = asyncio.run(topics())
                asyncio.run(produce_all(bootstrap, src, n))
                name = f"bench{v.replace('_', '')}{rnd % 1000}"
                path = work / f"{name}.yaml"
                text = PIPELINE.format(name=name, src=src, sink=sink, replicas=args.replicas)
                path.write_text(text + extra[v])
                client.deploy(path)
                wait_committed(stats_redis, name, n)
                count, span = asyncio.run(sink_span(bootstrap, sink, expect))
                client.delete(name)
                var_rates[v].append(n / span)
                print(f"round {rnd}: {v} {n / span:,.0f} ev/s", flush=True)

        eb_max = statistics.median(eb_rates)
        rate = args.latency_rate or eb_max / 2
        src, sink = asyncio.run(topics())
        path = work / "bench-lat.yaml"
        path.write_text(
            PIPELINE.format(name="benchlat", src=src, sink=sink, replicas=args.replicas)
        )
        client.deploy(path)
        eb_lat = asyncio.run(latency_run(bootstrap, src, sink, rate, args.latency_seconds))
        client.delete("benchlat")
        base_lat = asyncio.run(run_baseline_latency(bootstrap, rate, args.latency_seconds, topics))
        var_lat: dict[str, list[float]] = {}
        for v in variants:
            src, sink = asyncio.run(topics())
            path = work / f"bench-lat-{v}.yaml"
            name = f"benchlat{v.replace('_', '')}"
            text = PIPELINE.format(name=name, src=src, sink=sink, replicas=args.replicas)
            path.write_text(text + extra[v])
            client.deploy(path)
            var_lat[v] = asyncio.run(latency_run(bootstrap, src, sink, rate, args.latency_seconds))
            client.delete(name)
    finally:
        ray.shutdown()
        broker.stop()
        redis.stop()
    result = {
        "benchmark": "kafka_pipeline",
        "broker": args.broker,
        "events": n,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup,
        "replicas": args.replicas,
        "tls": args.tls,
        "outputs_per_round": expect,
        "baseline_events_per_s": round(statistics.median(base_rates)),
        "eventbus_events_per_s": round(statistics.median(eb_rates)),
        "ratio": round(statistics.median(eb_rates) / statistics.median(base_rates), 3),
        "target_ratio": 0.6 if args.tls else 0.9,
        "latency_rate_events_per_s": round(rate),
        "eventbus_p50_ms": round(pct(eb_lat, 0.5), 1),
        "eventbus_p99_ms": round(pct(eb_lat, 0.99), 1),
        "baseline_p50_ms": round(pct(base_lat, 0.5), 1),
        "baseline_p99_ms": round(pct(base_lat, 0.99), 1),
        "latency_samples": len(eb_lat),
        "all_rates": {
            "baseline": [round(r) for r in base_rates],
            "eventbus": [round(r) for r in eb_rates],
            **{v: [round(r) for r in var_rates[v]] for v in variants},
        },
        "guarantee": args.guarantee,
        "commit_interval_ms": args.commit_interval_ms if variants else None,
        "variants": {
            v: {
                "events_per_s": round(statistics.median(var_rates[v])),
                "ratio_to_at_least_once": round(
                    statistics.median(var_rates[v]) / statistics.median(eb_rates), 3
                ),
                "p50_ms": round(pct(var_lat[v], 0.5), 1),
                "p99_ms": round(pct(var_lat[v], 0.99), 1),
            }
            for v in variants
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
