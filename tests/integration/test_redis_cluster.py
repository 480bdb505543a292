"""EventBus state on a real three-master Redis Cluster on loopback (nothing mocked).

Every Lua script declares its keys and every key of one script or transaction shares a hash
tag, so each runs on one slot; the client (``redis+cluster://``) follows MOVED/ASK. Steps of
different pipelines land on different masters.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import numpy as np
import pytest

from eventbus._internal import keys
from eventbus._internal.redis_client import check_redis, connect
from eventbus.eventing._delivery import RedisDeduper
from eventbus.models import ModelRegistry
from eventbus.pipelines.steps._join_pairs import RedisPairState
from eventbus.pipelines.steps._join_state import RedisJoinState
from tests.fixtures.redis_secure import RedisCluster

pytestmark = [pytest.mark.integration, pytest.mark.redis]


def _name() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


def test_cluster_url_makes_a_cluster_client(redis_cluster: RedisCluster) -> None:
    from redis.cluster import RedisCluster as Client

    check_redis(redis_cluster.url)
    r = connect(redis_cluster.url)
    assert isinstance(r, Client) and len(r.get_primaries()) == 3
    # the join states of many steps spread over the three masters
    nodes = {r.get_node_from_key(keys.join_prefix(_name(), "pair") + "due").port for _ in range(30)}
    r.close()
    assert len(nodes) == 3


def test_join_first_on_cluster(redis_cluster: RedisCluster) -> None:
    state = RedisJoinState(redis_cluster.url, keys.join_prefix(_name(), "pair"))
    items = [(f"k{i}", "orders", b'{"o":%d}' % i, f"o{i}", 1_000, "-") for i in range(200)]
    assert state.join(1_000, 1_000, 2, 10_000, items) == [0] * 200
    done = state.join(1_001, 1_000, 2, 10_000, [("k0", "payments", b"{}", "p0", 1_001, "-")])
    assert isinstance(done[0], dict) and done[0]["orders"] == b'{"o":0}'
    table = [("t", "orders", b"1", "t1", 1_001, "-"), ("t", "x", b"", "x1", 1_001, "-")]
    assert state.latest(60_000, "orders", table, 1_001) == [None, b"1"]
    claimed = state.claim_due(5_000, 1_000, 1_000)  # the 199 unmatched windows closed
    assert len(claimed) == 199 and state.pending() == 0
    state.ack([k for k, _ in claimed])
    assert state.claim_due(10_000, 1_000, 1_000) == []
    state._redis.close()


def test_join_every_on_cluster(redis_cluster: RedisCluster) -> None:
    state = RedisPairState(redis_cluster.url, keys.join_prefix(_name(), "pairs"))
    a = state.add(
        1_000,
        1_000,
        100,
        1 << 20,
        [("k", "a", b"A1", "1", 1_000, "-"), ("k", "b", b"B1", "2", 1_000, "-")],
    )
    assert [x[0] for x in a] == [1, 1] and a[1][3] == [("a/1", 1, b"A1")]
    # the window closed unswept: the next event renames it x:<t0>:k and opens a new one
    state.add(3_000, 1_000, 100, 1 << 20, [("k", "a", b"A2", "3", 3_000, "-")])
    claimed = state.claim_due(10_000, 1_000, 100)
    assert sorted(m for m, _ in claimed) == ["w:k", "x:1000:k"]
    state.ack([(m, h["__t0"].decode()) for m, h in claimed])
    assert state.claim_due(20_000, 1_000, 100) == [] and state.pending() == 0
    state._redis.close()


class _Sink:
    config = None

    async def positions(self) -> None:
        return None


def test_dedupe_on_cluster(redis_cluster: RedisCluster) -> None:
    async def run() -> tuple[list[bool], int]:
        d = RedisDeduper(redis_cluster.url, _name(), 60)
        try:
            ks = d.digests([f"/s\x00{i}" for i in range(500)])
            await d.mark(ks[:250], hashed=True)
            skip = await d.claim(ks, _Sink())
            return skip, d.errors
        finally:
            await d.close()

    skip, errors = asyncio.run(run())
    assert errors == 0 and skip == [True] * 250 + [False] * 250


def test_model_registry_on_cluster(redis_cluster: RedisCluster) -> None:
    reg = ModelRegistry(redis_cluster.url)
    name = _name()
    v1 = reg.add_version(name, b"one", format="export")
    v2 = reg.add_version(name, b"two", format="export")
    reg.set_serving(name, v1)
    reg.set_split(name, v2, 0.25)
    assert reg.state(name) == {
        "serving": 1,
        "split": {"version": 2, "weight": 0.25},
        "shadow": None,
        "revision": 2,
    }
    assert reg.blob(name, v2) == b"two" and name in reg.names()
    reg.record_inputs(name, np.ones((3, 4), dtype=np.float32))
    assert reg.recent_inputs(name, (4,)).shape == (3, 4)
    reg.set_labelled(name, np.zeros((2, 4)), np.zeros(2), 0.5)
    labelled = reg.labelled(name)
    assert labelled is not None and labelled[2] == 0.5
    reg._r.close()


def test_control_plane_transaction_and_canary_scan_on_cluster(
    redis_cluster: RedisCluster,
) -> None:
    r = connect(redis_cluster.url, decode_responses=True)
    name = _name()
    with r.pipeline(transaction=True) as tx:  # as the controller's deploy
        tx.hset(keys.PIPELINES, name, json.dumps({"version": 1}))
        tx.hset(keys.pipeline_versions(name), "1", json.dumps({"version": 1}))
        tx.set(keys.canary(name), "{}")
        tx.execute()
    found = [keys.canary_pipeline(k) for k in r.scan_iter(keys.CANARY_PATTERN)]
    assert name in found
    r.delete(keys.pipeline_versions(name), keys.canary(name), keys.canary_figures(name))
    assert r.get(keys.canary(name)) is None
    r.close()


def test_history_on_cluster(redis_cluster: RedisCluster) -> None:
    # a pipeline's stats entry and its history buckets share a slot: one pipeline, two EVALs
    from tests.integration.test_history_redis import write_and_read

    asyncio.run(write_and_read(redis_cluster.url))


def test_cluster_benchmark_state_calls_run(redis_cluster: RedisCluster) -> None:
    """``benchmarks/join.py --redis-cluster`` calls the state classes directly: keep its calls
    in step with their signatures (a smoke run on the cluster, rates only checked positive)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from _join_cluster import _items, _one_store

    rates = _one_store(redis_cluster.url, _items(300, seed=1))
    assert set(rates) == {"every_ops_per_s", "first_ops_per_s", "dedupe_ops_per_s"}
    assert all(r > 0 for r in rates.values())
