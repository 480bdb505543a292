"""``GET /v1/history`` and ``/v1/pipelines/{name}/history``: the dashboard's chart data, its
query parameter's hostile values, and many readers sharing one Redis read.

Redis is an in-memory double here (hashes only); the real-Redis path is in
``tests/integration/test_dashboard.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from eventbus._internal import keys
from eventbus.gateway._http import build_http_app
from eventbus.gateway._observer import Observer
from eventbus.observability._history import BUCKET_S, WINDOW_S, HistoryRecorder, bucket_row


class HashRedis:
    """The asyncio Redis calls the observer makes, over dicts; counts pipeline round trips."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, str]] = {}
        self.round_trips = 0
        self.keys_read = 0

    async def hgetall(self, key: str) -> dict[str, str]:
        return dict(self.hashes.get(key, {}))

    async def hget(self, key: str, field: str) -> str | None:
        return self.hashes.get(key, {}).get(field)

    async def hexists(self, key: str, field: str) -> bool:
        return field in self.hashes.get(key, {})

    async def hkeys(self, key: str) -> list[str]:
        return list(self.hashes.get(key, {}))

    async def eval(self, script: str, numkeys: int, *args: Any) -> list[list[int]]:
        """The read script (the Python twin of its Lua: ``bucket_row``)."""
        self.round_trips += 1
        self.keys_read += numkeys
        await asyncio.sleep(0.01)  # a round trip: concurrent readers overlap it
        return [bucket_row(self.hashes.get(k, {})) for k in args[:numkeys]]

    def apply(self, cmds: list[tuple[Any, ...]]) -> None:
        for method, key, *args in cmds:
            h = self.hashes.setdefault(key, {})
            if method == "hincrby":
                h[args[0]] = str(int(h.get(args[0], 0)) + args[1])
            elif method == "hset":
                h[args[0]] = str(args[1])


def record(name: str) -> str:
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {"sources": [{"http": {}}], "sink": {"kafka": {"topic": "out"}}},
    }
    return json.dumps({"name": name, "version": 1, "document": doc})


@pytest.fixture
def redis() -> HashRedis:
    r = HashRedis()
    r.hashes[keys.PIPELINES] = {"orders": record("orders"), "idle": record("idle")}
    return r


@pytest.fixture
def client(ingress_factory, redis: HashRedis) -> httpx.AsyncClient:
    ingress, _ = ingress_factory()
    app = build_http_app(ingress, observer=Observer(redis))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def test_history_of_a_pipeline_is_its_buckets_as_columns(client, redis) -> None:
    now = time.time()
    t = (int(now) // BUCKET_S - 3) * BUCKET_S  # a settled bucket
    rec = HistoryRecorder("orders", "replica-1")
    body = {
        "sources": [{"consumed": 50, "outputs": 40}],
        "metrics": {"sources": [{"lag": {"t[0]": 12}}]},
    }
    redis.apply(rec.commands(body, t + 1))
    async with client as c:
        r = await c.get("/v1/pipelines/orders/history?window_s=60")
        assert r.status_code == 200, r.text
        h = r.json()
        assert h["name"] == "orders" and h["window_s"] == 60 and h["bucket_s"] == BUCKET_S
        assert len(h["t"]) == 6 and h["t"] == sorted(h["t"])
        i = h["t"].index(t)
        assert (h["in_per_s"][i], h["out_per_s"][i]) == (5.0, 4.0)
        assert (h["lag"][i], h["replicas"][i]) == (12, 1)
        assert h["replicas"][:i] == [0] * i  # nothing ran before: zero replicas
        everything = (await c.get("/v1/history")).json()
        assert [p["name"] for p in everything] == ["idle", "orders"]
        assert all(len(p["t"]) == WINDOW_S // BUCKET_S for p in everything)
        assert set(everything[0]["in_per_s"]) == {0.0}
        r = await c.get("/v1/pipelines/nope/history")
        assert r.status_code == 404
        assert r.json()["error"] == (
            "no pipeline named 'nope' is deployed; GET /v1/stats lists them"
        )


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "window_s=abc",
            "window_s 'abc' is not a whole number of seconds; give whole seconds from 10 to 900 (e.g. window_s=300)",
        ),
        ("window_s=-5", "window_s '-5' is not a whole number of seconds;"),
        ("window_s=1e3", "window_s '1e3' is not a whole number of seconds;"),
        ("window_s=NaN", "window_s 'NaN' is not a whole number of seconds;"),
        ("window_s=%D9%A3%D9%A0%D9%A0", "window_s '٣٠٠' is not a whole number of seconds;"),
        ("window_s=", "window_s '' is not a whole number of seconds;"),
        ("window_s=" + "9" * 50_000, "window_s '" + "9" * 40 + "...' is not a whole number"),
        ("window_s=9", "window_s 9 is out of range; give whole seconds from 10 to 900"),
        ("window_s=901", "window_s 901 is out of range;"),
        ("window_s=0", "window_s 0 is out of range;"),
        ("window_s=60&window_s=120", "window_s is given 2 times; give it once"),
        ("windows_s=60", "unknown query parameter 'windows_s'; /v1/history takes window_s only"),
        ("x" * 10_000 + "=1", "unknown query parameter '" + "x" * 40 + "...'"),
    ],
)
async def test_hostile_window_parameters_get_a_400_naming_them(client, query, message) -> None:
    async with client as c:
        for path in ("/v1/history", "/v1/pipelines/orders/history"):
            r = await c.get(f"{path}?{query}")
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"].startswith(message.replace("/v1/history", path))


async def test_hostile_pipeline_names_get_a_short_404(client) -> None:
    async with client as c:
        for name in ("x" * 5000, "%00", "a%20b", "ORDERS"):
            r = await c.get(f"/v1/pipelines/{name}/history")
            assert r.status_code == 404, name
            assert r.json()["error"].startswith("no pipeline named ")
            assert len(r.json()["error"]) < 200
        # a path that leaves the route is no history request: refused, never a 5xx
        r = await c.get("/v1/pipelines/..%2F..%2Fetc/history")
        assert r.status_code in (404, 405)


async def test_many_concurrent_readers_share_one_redis_read(client, redis) -> None:
    async with client as c:
        rs = await asyncio.gather(
            *(
                c.get(f"/v1/pipelines/orders/history?window_s={10 * (1 + i % 90)}")
                for i in range(300)
            )
        )
    assert {r.status_code for r in rs} == {200}
    assert [len(r.json()["t"]) for r in rs[:3]] == [1, 2, 3]
    # one read of the 90 buckets, shared (a second only if the 300 took longer than the 2 s
    # cache on a loaded machine: then only a bucket that settled meanwhile is read)
    assert redis.round_trips <= 2 and redis.keys_read <= WINDOW_S // BUCKET_S + 1


async def test_settled_buckets_are_read_once(redis) -> None:
    """A poll after the cache expired reads only the buckets that settled since (none or
    one here), not the whole window again; a redeploy reads it all anew."""
    observer = Observer(redis)
    assert len((await observer.history("orders"))["t"]) == WINDOW_S // BUCKET_S
    observer._history.clear()  # as after _HISTORY_CACHE_S
    await observer.history("orders")
    assert redis.round_trips <= 2 and redis.keys_read <= WINDOW_S // BUCKET_S + 1
    before = redis.keys_read
    record = json.loads(redis.hashes[keys.PIPELINES]["orders"])
    redis.hashes[keys.PIPELINES]["orders"] = json.dumps({**record, "deployed_at": 1.0})
    observer._history.clear()
    await observer.history("orders")
    assert redis.keys_read - before == WINDOW_S // BUCKET_S


async def test_a_degraded_pipeline_shows_its_state_and_reason(redis) -> None:
    """The dashboard's view (the gateway's) says DEGRADED with the controller's reason while
    the mark is there, and RUNNING again once it is gone."""
    observer = Observer(redis)
    assert (await observer.view("orders"))["state"] == "RUNNING"
    reason = "spec.sink.kafka.topic 'out' no longer exists on k:9092; `eventbus logs controller`"
    redis.hashes[keys.DEGRADED] = {"orders": json.dumps({"reason": reason, "since": 5.0})}
    view = await observer.view("orders")
    assert (view["state"], view["degraded_reason"], view["degraded_since"]) == (
        "DEGRADED",
        reason,
        5.0,
    )
    assert (await observer.view("idle"))["state"] == "RUNNING"
    redis.hashes[keys.DEGRADED] = {}
    assert (await observer.view("orders"))["state"] == "RUNNING"
