"""The ``enrich`` step against a hand-written asyncio loop with the same cache.

Both enrich the same events (``--keys`` customers, each in ``--events / --keys`` events, in a
shuffled order: a 90% cache hit rate by default) in batches of ``--batch``, from the same
endpoint: a bare ASGI app under uvicorn in a process of its own, answering a small JSON
object per customer and counting its calls.

* baseline: per batch, on one asyncio loop: each event's key looked up in an
  :class:`AnswerCache` (the step's own TTL/LRU cache), misses fetched with one
  ``httpx.AsyncClient`` (at most ``--concurrency`` in flight, one call per key), the answer
  merged into a copy of the event's data;
* EventBus: ``EnrichStep.process(batch)`` with ``cache: {key: data.cid, ttl_s}`` and
  ``max_concurrency``, as a replica calls it.

Figures: events/s of each (median of ``--rounds``, a fresh cache each round), ``ratio`` (step /
baseline, target >= 0.7), and the endpoint's calls per round against the bound
``keys x TTL windows`` (windows: the round's length over ``ttl_s``, rounded up).

Last line: one JSON object with the figures.

Run: ``.venv/bin/python benchmarks/enrich.py [--events 20000] [--keys 2000] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import random
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import httpx
import orjson

from eventbus import CloudEvent
from eventbus.pipelines.steps._enrich import EnrichStep
from eventbus.pipelines.steps._enrich_cache import AnswerCache
from eventbus.pipelines.steps._enrich_config import EnrichConfig


def serve_endpoint(port: int, calls: Any) -> None:
    import uvicorn

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        with calls.get_lock():
            calls.value += 1
        cid = scope["path"].rsplit("/", 1)[1]
        body = orjson.dumps({"name": f"customer {cid}", "tier": "gold", "since": 2019})
        head = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_batches(n: int, keys: int, batch: int, seed: int) -> list[list[CloudEvent]]:
    order = [i % keys for i in range(n)]
    random.Random(seed).shuffle(order)
    events = [
        CloudEvent.create(type="order", source="/bench", id=f"o{i}", data={"cid": k, "amount": i})
        for i, k in enumerate(order)
    ]
    return [events[i : i + batch] for i in range(0, n, batch)]


def run_step(url: str, batches: list[list[CloudEvent]], ttl_s: float, concurrency: int) -> float:
    config = EnrichConfig(
        http={"url": url + "/customers/{data.cid}"},
        into="data.customer",
        cache={"key": "data.cid", "ttl_s": ttl_s, "max_entries": 100_000},
        max_concurrency=concurrency,
    )
    step = EnrichStep("enrich", config)
    try:
        step.process(batches[0][:1])  # connect (not timed; the baseline does the same)
        started = time.perf_counter()
        for batch in batches:
            out = step.process(batch)
            assert all(type(e) is CloudEvent for e in out), out[:3]
        return time.perf_counter() - started
    finally:
        step.close()


async def _baseline(
    url: str, batches: list[list[CloudEvent]], ttl_s: float, concurrency: int
) -> float:
    cache = AnswerCache(ttl_s, 100_000)
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        timeout=5.0,
        trust_env=False,
    ) as client:

        async def fetch(key: Any) -> None:
            async with sem:
                r = await client.get(f"{url}/customers/{key}")
            r.raise_for_status()
            cache.finish(key, orjson.loads(r.content))

        first = batches[0][0].data["cid"]
        await fetch(first)
        started = time.perf_counter()
        for batch in batches:
            waits: list[Any] = []
            tasks = []
            for e in batch:
                key = e.data["cid"]
                value = cache.get(key, None)
                if value is None:
                    flight = cache.flight(key)
                    if flight is None:
                        flight = cache.start(key)
                        tasks.append(fetch(key))
                    waits.append(flight)
                else:
                    waits.append(value)
            await asyncio.gather(*tasks)
            out = []
            for e, w in zip(batch, waits):
                value = w.result() if isinstance(w, asyncio.Future) else w
                out.append(CloudEvent(e.attributes, {**e.data, "customer": value}))
            assert len(out) == len(batch)
        return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--keys", type=int, default=2_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--ttl-s", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    calls = multiprocessing.Value("i", 0)
    server = multiprocessing.Process(target=serve_endpoint, args=(port, calls), daemon=True)
    server.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{url}/customers/0", timeout=1.0, trust_env=False)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        step_s, base_s, step_calls, windows = [], [], [], []
        for r in range(args.rounds):
            batches = make_batches(args.events, args.keys, args.batch, seed=r)
            before = calls.value
            step_s.append(run_step(url, batches, args.ttl_s, args.concurrency))
            step_calls.append(calls.value - before)
            windows.append(math.ceil(step_s[-1] / args.ttl_s))
            base_s.append(asyncio.run(_baseline(url, batches, args.ttl_s, args.concurrency)))
            print(
                f"round {r}: step {args.events / step_s[-1]:,.0f} ev/s ({step_calls[-1]} calls), "
                f"baseline {args.events / base_s[-1]:,.0f} ev/s",
                flush=True,
            )
    finally:
        server.terminate()
        server.join(5)
    step_eps = args.events / statistics.median(step_s)
    base_eps = args.events / statistics.median(base_s)
    result = {
        "benchmark": "enrich",
        "events": args.events,
        "keys": args.keys,
        "hit_rate": 1 - args.keys / args.events,
        "batch": args.batch,
        "ttl_s": args.ttl_s,
        "step_events_per_s": round(step_eps),
        "baseline_events_per_s": round(base_eps),
        "ratio": round(step_eps / base_eps, 3),
        "target_ratio": 0.7,
        "endpoint_calls_per_round": step_calls,
        "calls_bound_keys_x_windows": [args.keys * w for w in windows],
        "calls_within_bound": all(c <= args.keys * w for c, w in zip(step_calls, windows)),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
