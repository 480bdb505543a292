"""CPU per event of the aggregate step's batch path, in process, against the plain loop's.

``aggregate.py`` runs end to end on two cores shared with the broker, Ray and whatever else
runs on the machine, so its figures move with the load. This one measures what each side
spends per event on the events of ``aggregate.py`` (a tumbling count + sum per key, 1,000 keys,
batches of 2,000), in one process, with a real Redis and no broker:

* baseline: ``aggregate.py``'s redis-py loop per batch: each record's ``ce_time`` header and
  JSON value parsed, each (key, window)'s count and sum folded in Python, one pipelined round
  trip of ``HINCRBY``/``HINCRBYFLOAT``, the windows the batch closed read and deleted;
* EventBus: the replica's code over the same records: ``decode_kafka_records``, the
  ``aggregate`` step (``AggregateStep.process``: CEL, windows, the add script), the timer's
  close and ack (the claim script, each window's output event); with ``--dedupe``, the step
  records each event's digest in the same script (``delivery.dedupe``).

CPU time of this thread (``time.thread_time``: the client's Python) and of the Redis server
(its ``used_cpu_user + used_cpu_sys``), the garbage collector off as in a replica; best of
``--rounds``. Kafka fetch and produce, the same for both, are left out.

Last line: one JSON object with µs per event of each side (client, Redis, total) and
``ratio`` (baseline µs / EventBus µs).

Run: ``.venv/bin/python benchmarks/aggregate_cpu.py [--events 100000] [--rounds 5] [--dedupe]``
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
import redis
from aggregate import (
    WINDOW_MS,
    answer,
    baseline_closed,
    baseline_fold,
    baseline_queue,
    iso,
    make_events,
)

from eventbus._internal.redis_service import start_redis
from eventbus.eventing._codecs import RawRecord, decode_kafka_records
from eventbus.pipelines.steps._aggregate import AggregateStep
from eventbus.pipelines.steps._aggregate_config import AggregateConfig
from eventbus.pipelines.steps._aggregate_timer import AggregateTimer

BATCH = 2000


def records(n: int, windows: int) -> list[RawRecord]:
    """The records of ``aggregate.py``'s events (the last, far-ahead one left out)."""
    out = []
    for i, (k, t, amount) in enumerate(make_events(n, windows)[:-1]):
        headers = [
            ("ce_specversion", b"1.0"),
            ("ce_id", f"e{i}".encode()),
            ("ce_source", b"/bench"),
            ("ce_type", b"metric"),
            ("ce_time", iso(t).encode()),
            ("content-type", b"application/json"),
        ]
        value = orjson.dumps({"k": k, "amount": amount})
        out.append(RawRecord(value, headers, k.encode(), "agg-in", 0, i))
    return out


def redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def eventbus(recs: list[RawRecord], url: str, dedupe: bool) -> tuple[float, dict[str, float]]:
    config = AggregateConfig.model_validate(
        {
            "key": "data.k",
            "window": {"tumbling": {"size_s": WINDOW_MS / 1000}},
            "aggregations": {"n": "count", "total": {"sum": "data.amount"}},
            "idle_timeout_s": 60,
        }
    )
    name = f"aggcpu{uuid.uuid4().hex[:8]}"
    step = AggregateStep(
        "per_key", config, pipeline=name, redis_url=url, dedupe_window_s=600 if dedupe else None
    )
    timer = AggregateTimer(step)
    stages = dict.fromkeys(("decode", "step", "close"), 0.0)
    outputs = 0
    for s in range(0, len(recs), BATCH):
        t0 = time.thread_time()
        events, _ = decode_kafka_records(recs[s : s + BATCH], default_type="x", default_source=None)
        t1 = time.thread_time()
        step.process(events)
        t2 = time.thread_time()
        fired = timer.close()
        timer.ack(fired)
        outputs += len(fired.outputs)
        stages["decode"] += t1 - t0
        stages["step"] += t2 - t1
        stages["close"] += time.thread_time() - t2
    return float(outputs), stages


def baseline(recs: list[RawRecord], url: str) -> tuple[float, dict[str, float]]:
    r = redis.Redis.from_url(url)
    prefix = f"bench:aggcpu:{uuid.uuid4().hex[:6]}:"
    wm, open_windows, outputs = 0, set(), 0
    t0 = time.thread_time()
    for s in range(0, len(recs), BATCH):
        parts: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
        wm = baseline_fold(recs[s : s + BATCH], parts, wm)
        pipe = r.pipeline(transaction=False)
        closed = baseline_queue(pipe, parts, prefix, open_windows, wm)
        results = pipe.execute()
        for k, w, v in baseline_closed(closed, results[2 * len(parts) :: 2], open_windows):
            orjson.dumps({"key": k, "start": w, "n": int(v["n"]), "total": float(v["s"])})
            outputs += 1
    return float(outputs), {"loop": time.thread_time() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dedupe", action="store_true", help="EventBus with delivery.dedupe")
    ap.add_argument("--redis-url", default=None, help="a Redis to use (default: start one)")
    args = ap.parse_args()
    recs = records(args.events, args.windows)
    # every window but the one holding the latest event time closes
    evs = make_events(args.events, args.windows)[:-1]
    last = max(t for _, t, _ in evs)
    expect = sum(
        1 for _, start in answer([*evs, evs[-1]]) if start + WINDOW_MS <= last
    )  # (answer leaves out a last, far-ahead event)
    server = None
    if args.redis_url is None:
        server = start_redis(data_dir=Path(tempfile.mkdtemp(prefix="eb-aggcpu-")))
    url = args.redis_url or server.address  # type: ignore[union-attr]
    r = redis.Redis.from_url(url)
    best: dict[str, dict[str, float]] = {}
    gc.collect()
    gc.disable()
    try:
        for _ in range(args.rounds):
            for side in ("baseline", "eventbus"):
                before = redis_cpu(r)
                if side == "eventbus":
                    outputs, stages = eventbus(recs, url, args.dedupe)
                else:
                    outputs, stages = baseline(recs, url)
                us = {k: 1e6 * v / len(recs) for k, v in stages.items()}
                us["client"] = sum(us.values())
                us["redis"] = 1e6 * (redis_cpu(r) - before) / len(recs)
                us["total"] = us["client"] + us["redis"]
                if outputs != expect:
                    msg = f"{side}: {outputs:.0f} windows closed, expected {expect}"
                    raise AssertionError(msg)
                if side not in best or us["total"] < best[side]["total"]:
                    best[side] = us
    finally:
        gc.enable()
        if server is not None:
            server.stop()
    for side, us in best.items():
        print(f"{side}: " + ", ".join(f"{k} {v:.2f} µs" for k, v in us.items()), flush=True)
    print(
        json.dumps(
            {
                "benchmark": "aggregate_cpu",
                "events": len(recs),
                "windows_closed": expect,
                "dedupe": args.dedupe,
                "rounds": args.rounds,
                "baseline_us_per_event": {k: round(v, 2) for k, v in best["baseline"].items()},
                "eventbus_us_per_event": {k: round(v, 2) for k, v in best["eventbus"].items()},
                "ratio": round(best["baseline"]["total"] / best["eventbus"]["total"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
