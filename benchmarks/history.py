"""The 15-minute history's costs on a real Redis: the write it rides on, the dashboard's read,
and the memory a pipeline's history takes.

* write: a replica's stats write as it was (one ``HSET`` of the entry) against the same write
  with the history (``HSET`` + the recorder's ``HINCRBY``/``HSET``/``EXPIRE`` on one
  pipeline, one round trip), for a busy replica (every figure moved) and an idle one (the
  heartbeat: only its lag and liveness). Median microseconds per write, over ``--writes``.
* read: ``read_history`` of one pipeline (90 buckets, one ``EVAL``) and the gateway's
  ``/v1/history`` work for ``--pipelines`` pipelines (``Observer.histories``): cold (every
  bucket read) and warm (a dashboard's next poll: settled buckets are not read again), each
  pipeline with a full 15 minutes of a busy replica and a gateway. Median milliseconds.
* memory: ``MEMORY USAGE`` summed over one pipeline's buckets (bytes).

Last line: one JSON object with the figures and ``ratio`` (busy write with history / without).

Run: ``.venv/bin/python benchmarks/history.py [--writes 3000] [--pipelines 50]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eventbus._internal import keys
from eventbus._internal.redis_service import start_redis
from eventbus.observability._history import BUCKET_S, WINDOW_S, HistoryRecorder, read_history
from eventbus.observability._metrics import LATENCY_BOUNDS_S, Histogram


def body(i: int) -> dict[str, Any]:
    """A replica's entry after ``i`` busy seconds: counters, latency histogram, lag."""
    h = Histogram(LATENCY_BOUNDS_S)
    h.observe(0.004, count=900 * i)
    h.observe(0.02, count=90 * i)
    h.observe(0.2, count=10 * i)
    return {
        "sources": [{"consumed": 1000 * i, "outputs": 990 * i, "failed": i, "committed": 1000 * i}],
        "metrics": {"sources": [{"latency": h.snapshot(), "lag": {"t[0]": i % 50, "t[1]": 3}}]},
    }


async def time_writes(redis: Any, n: int, with_history: bool, busy: bool) -> float:
    rec = HistoryRecorder("bench-write", "replica-1")
    key = keys.stats("bench-write")
    took = []
    for i in range(n):
        b = body(i if busy else 1)
        start = time.perf_counter()
        value = json.dumps({**b, "at": time.time(), "final": False})
        if with_history:
            pipe = redis.pipeline(transaction=False)
            pipe.hset(key, "replica-1", value)
            rec.queue(pipe, b)
            await pipe.execute()
        else:
            await redis.hset(key, "replica-1", value)
        took.append(time.perf_counter() - start)
    return statistics.median(took) * 1e6


async def longest_stall(work: Any) -> float:
    """Run ``work`` while a 1 ms ticker measures the event loop's longest stall (s)."""
    worst = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - t)

    task = asyncio.create_task(ticker())
    try:
        await work
    finally:
        done.set()
        await task
    return worst


async def fill(redis: Any, pipeline: str, now: float) -> None:
    """15 minutes of a busy replica (a write a second) and a gateway (every 5 s)."""
    rep, gw = HistoryRecorder(pipeline, "replica-1"), HistoryRecorder(pipeline, "gateway-1")
    pipe = redis.pipeline(transaction=False)
    for s in range(WINDOW_S):
        t = now - WINDOW_S + s
        rep.queue(pipe, body(s + 1), t)
        if s % 5 == 0:
            gw.queue(pipe, {"role": "gateway", "sync": {"consumed": s, "outputs": s}}, t)
    await pipe.execute()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import redis.asyncio as aioredis

    from eventbus.gateway._observer import Observer

    with tempfile.TemporaryDirectory() as tmp:
        server = start_redis(data_dir=Path(tmp))
        redis = aioredis.Redis.from_url(server.address, decode_responses=True)
        try:
            figures: dict[str, Any] = {}
            for busy in (True, False):
                kind = "busy" if busy else "idle"
                # alternate, so drift on this noisy machine hits both alike
                rounds: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(3):
                    for hist in (False, True):
                        rounds[hist].append(await time_writes(redis, args.writes // 3, hist, busy))
                figures[f"write_{kind}_us"] = round(statistics.median(rounds[False]), 1)
                figures[f"write_{kind}_with_history_us"] = round(statistics.median(rounds[True]), 1)
            now = time.time()
            names = [f"bench-{i}" for i in range(args.pipelines)]
            for name in names:
                await fill(redis, name, now)
                await redis.hset(keys.PIPELINES, name, json.dumps({"name": name}))
            reads = []
            for _ in range(20):
                start = time.perf_counter()
                h = await read_history(redis, names[0], now=now)
                reads.append(time.perf_counter() - start)
            assert sum(h["in_per_s"]) > 0 and h["replicas"][-1] == 1
            alls, warm, stalls, idle_stalls = [], [], [], []
            for _ in range(5):
                observer = Observer(redis)  # a cold cache: every bucket is read
                idle_stalls.append(await longest_stall(asyncio.sleep(0.5)))
                start = time.perf_counter()
                stall = longest_stall(observer.histories())
                stalls.append(await stall)
                alls.append(time.perf_counter() - start)
                got = await observer.histories()
                observer._history.clear()  # the 2 s cache expired: a dashboard's next poll
                start = time.perf_counter()
                await observer.histories()
                warm.append(time.perf_counter() - start)
            assert len(got) == args.pipelines
            bucket_keys = [
                keys.history(names[0], int(t))
                for t in range(int(now - WINDOW_S) // BUCKET_S * BUCKET_S, int(now) + 1, BUCKET_S)
            ]
            memory = 0
            for k in bucket_keys:
                memory += await redis.memory_usage(k) or 0
            figures |= {
                "read_one_pipeline_ms": round(statistics.median(reads) * 1000, 2),
                f"read_{args.pipelines}_pipelines_cold_ms": round(
                    statistics.median(alls) * 1000, 1
                ),
                f"read_{args.pipelines}_pipelines_warm_ms": round(
                    statistics.median(warm) * 1000, 1
                ),
                # the gateway loop's longest stall during a cold read, and while idle (the
                # machine's own noise), both in the same run
                "cold_read_longest_loop_stall_ms": round(statistics.median(stalls) * 1000, 1),
                "idle_longest_loop_stall_ms": round(statistics.median(idle_stalls) * 1000, 1),
                "bytes_per_pipeline": memory,
                "buckets_per_pipeline": sum([await redis.exists(k) for k in bucket_keys]),
            }
            figures["ratio"] = round(
                figures["write_busy_with_history_us"] / figures["write_busy_us"], 2
            )
            return figures
        finally:
            await redis.aclose()
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=3000)
    parser.add_argument("--pipelines", type=int, default=50)
    out = asyncio.run(main(parser.parse_args()))
    for k, v in out.items():
        print(f"{k:>32}: {v}")
    print(json.dumps(out))
