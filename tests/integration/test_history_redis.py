"""The history's two Lua scripts on a real Redis (the session's) and a real Redis Cluster: what
writers add with one ``EVAL`` each is what the read script sums, bucket by bucket, as its
Python twin (``bucket_row``) reads the same hashes; buckets expire; a delete removes them."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from eventbus._internal import keys
from eventbus._internal.redis_client import connect_async
from eventbus.observability._history import (
    BUCKET_S,
    TTL_S,
    HistoryRecorder,
    bucket_keys,
    bucket_row,
    history_columns,
    read_history,
)
from eventbus.observability._metrics import LATENCY_BOUNDS_S, Histogram

pytestmark = [pytest.mark.integration, pytest.mark.redis]


def body(consumed: int, lag: int, slow: int = 0) -> dict[str, Any]:
    h = Histogram(LATENCY_BOUNDS_S)
    h.observe(0.003, count=consumed - slow)
    h.observe(7.0, count=slow)
    return {
        "sources": [{"consumed": consumed, "outputs": consumed - 1, "failed": 1}],
        "metrics": {"sources": [{"latency": h.snapshot(), "lag": {"t[0]": lag}}]},
    }


async def write_and_read(url: str) -> None:
    name = f"h-{uuid.uuid4().hex[:8]}"
    redis = connect_async(url, decode_responses=True)
    now = time.time()
    t0 = (int(now) // BUCKET_S - 5) * BUCKET_S  # five buckets ago: settled
    try:
        writers = [HistoryRecorder(name, f"replica-{i}") for i in range(3)]
        gateway = HistoryRecorder(name, "gateway-1")
        for step in range(1, 31):  # 30 writes a writer over 3 buckets
            pipe = redis.pipeline(transaction=False)
            for i, w in enumerate(writers):
                w.queue(
                    pipe, body(100 * step + i, lag=step * (i + 1), slow=5 * step), t0 + step - 1
                )
            gateway.queue(pipe, {"role": "gateway", "sync": {"consumed": step}}, t0 + step - 1)
            await pipe.execute()
        got = await read_history(redis, name, now=now, window_s=60)
        hashes = {t: await redis.hgetall(keys.history(name, t)) for t in got["t"]}
        assert got == history_columns(list(hashes.items()), now, window_s=60)  # Lua == Python
        i = got["t"].index(t0)
        # bucket t0 holds steps 1..10: each replica 100*10+i in, the gateway 10
        assert got["in_per_s"][i] == (3 * 1000 + 3 + 10) / BUCKET_S
        assert got["replicas"][i : i + 3] == [3, 3, 3] and got["replicas"][i + 3] == 0
        assert got["lag"][i] == 10 * (1 + 2 + 3)  # each writer's highest in the bucket
        assert got["lag"][i + 3] is None
        assert 5.0 < got["p99_s"][i] <= 10.0 and got["p50_s"][i] <= 0.005
        row = bucket_row(hashes[t0])
        assert row[0] == 3013 and row[-1] == 3
        assert 0 < await redis.ttl(keys.history(name, t0)) <= TTL_S
        await redis.delete(*bucket_keys(name))  # what a pipeline's delete does (one slot)
        assert await redis.exists(keys.history(name, t0)) == 0
    finally:
        await redis.aclose()


def test_history_scripts_on_redis(redis_url: str) -> None:
    asyncio.run(write_and_read(redis_url))
