"""``benchmarks/join.py --redis-cluster``: the join's and dedupe's state operations on a
three-master Redis Cluster against one Redis server, same batches, same run.

Each round runs, on both stores in turn, the state calls a replica makes per batch of 2,000
events: the ``emit: every`` pair script (``RedisPairState.add``), the ``emit: first`` join
script (``RedisJoinState.join``) and the dedupe claim (``RedisDeduper.claim``), over pairs of
shuffled orders and payments. Every script declares its keys and every key of one step shares a
hash tag, so on the cluster each call goes to one master: the cost is the cluster client's
routing, not cross-slot work. The figure is operations (events) per second, median of rounds;
``cluster_slowdown`` is single/cluster (the target: at most 1.5).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BATCH = 2000


class _NoPositions:
    config = None

    async def positions(self) -> None:
        return None


def _items(n: int, seed: int) -> list[tuple[str, str, bytes, str, int, str]]:
    """(key, side, event JSON, event id, time ms, lane): the steps' state items (processing
    time: the time is the arrival's, one lane)."""
    rnd = random.Random(seed)
    now = int(time.time() * 1000)
    items = [(f"ord-{i}", "order", b'{"item":%d}' % i, f"o{i}", now, "-") for i in range(n)]
    items += [(f"ord-{i}", "payment", b'{"amount":%d}' % i, f"p{i}", now, "-") for i in range(n)]
    rnd.shuffle(items)
    return items


def _one_store(url: str, items: list[tuple[str, str, bytes, str, int, str]]) -> dict[str, float]:
    from eventbus._internal import keys
    from eventbus.eventing._delivery import RedisDeduper
    from eventbus.pipelines.steps._join_pairs import RedisPairState
    from eventbus.pipelines.steps._join_state import RedisJoinState

    name = f"jc{uuid.uuid4().hex[:8]}"
    batches = [items[i : i + BATCH] for i in range(0, len(items), BATCH)]
    rates: dict[str, float] = {}

    pairs = RedisPairState(url, keys.join_prefix(name, "every"))
    t0 = time.perf_counter()
    for b in batches:
        pairs.add(int(time.time() * 1000), 600_000, 1_000_000, 1 << 20, b)
    rates["every_ops_per_s"] = len(items) / (time.perf_counter() - t0)

    first = RedisJoinState(url, keys.join_prefix(name, "first"))
    t0 = time.perf_counter()
    for b in batches:
        first.join(int(time.time() * 1000), 600_000, 2, 1_000_000, b)
    rates["first_ops_per_s"] = len(items) / (time.perf_counter() - t0)

    async def dedupe() -> float:
        d = RedisDeduper(url, name, 600)
        t = time.perf_counter()
        for b in batches:
            await d.claim(d.digests([eid for *_, eid in b]), _NoPositions())
        rate = len(items) / (time.perf_counter() - t)
        assert d.errors == 0, "dedupe: Redis refused the claims (see the log above)"
        await d.close()
        return rate

    rates["dedupe_ops_per_s"] = asyncio.run(dedupe())
    for state in (pairs, first):
        state._redis.close()
    return rates


def compare(pairs: int, rounds: int) -> dict[str, Any]:
    """Run ``rounds`` interleaved rounds on one Redis and on a three-master cluster, both
    Debian's ``redis-server`` with the same settings (no persistence), started here."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.fixtures.redis_secure import _binary, _cli, start_redis_cluster

    from eventbus._internal.services import _launch, _wait_ready, free_port

    tmp = Path(tempfile.mkdtemp(prefix="eb-join-cluster-"))
    port = free_port()
    argv = [_binary("redis-server"), "--bind", "127.0.0.1", "--port", str(port)]
    argv += ["--dir", str(tmp), "--save", "", "--appendonly", "no"]
    single = _launch("redis", argv, tmp / "single.log", f"127.0.0.1:{port}", False)
    _wait_ready(single, lambda: "PONG" in _cli(port, "PING"), 15.0, "see its log")
    single_url = f"redis://127.0.0.1:{port}/0"
    cluster = start_redis_cluster(tmp)
    got: dict[str, dict[str, list[float]]] = {"single": {}, "cluster": {}}
    try:
        for rnd in range(-1, rounds):  # round -1 loads the scripts, unmeasured
            items = _items(pairs, rnd)
            order = [("single", single_url), ("cluster", cluster.url)]
            for store, url in order if rnd % 2 else order[::-1]:
                for k, v in _one_store(url, items).items():
                    if rnd >= 0:
                        got[store].setdefault(k, []).append(v)
            if rnd >= 0:
                print(
                    f"round {rnd}: "
                    + "; ".join(
                        f"{s} " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in got[s].items())
                        for s in got
                    ),
                    flush=True,
                )
    finally:
        cluster.stop()
        single.stop()
    med = {s: {k: round(statistics.median(v)) for k, v in d.items()} for s, d in got.items()}
    slowdown = {
        k.removesuffix("_ops_per_s"): round(med["single"][k] / med["cluster"][k], 3)
        for k in med["single"]
    }
    return {
        "benchmark": "join_redis_cluster",
        "events": 2 * pairs,
        "rounds": rounds,
        "single": med["single"],
        "cluster": med["cluster"],
        "cluster_slowdown": slowdown,
        "worst_slowdown": max(slowdown.values()),
        "target_max_slowdown": 1.5,
    }
