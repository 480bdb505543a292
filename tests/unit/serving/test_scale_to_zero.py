"""Scale to zero without a cluster: the watcher's decisions, the config, the Serve options,
how status and the gateway show and treat a pipeline at zero."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from eventbus.errors import IngressError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.gateway._ingress import Ingress
from eventbus.gateway._replies import error_reply
from eventbus.gateway._routes import RouteTable
from eventbus.observability._view import pipeline_view
from eventbus.pipelines._config import PipelineConfig, ReplicasConfig
from eventbus.serving._deployment import autoscaling_options
from eventbus.serving._scale_to_zero import Watched, decide, watched_of


def doc(replicas: Any, sources: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "orders"},
        "spec": {
            "sources": sources or [{"kafka": {"topic": "orders"}}],
            "steps": [],
            "sink": {"kafka": {"topic": "out"}},
            "serving": {"replicas": replicas},
        },
    }


def watched(idle_s: float = 10.0) -> Watched:
    return Watched("orders", {}, {}, idle_s=idle_s, poll_s=1.0, last_activity=0.0)


def test_idle_for_idle_s_without_lag_scales_down_and_activity_resets_the_clock() -> None:
    w = watched()
    c = {"g/t[0]": 5}
    assert decide(w, now=1, lag=0, committed=c, wake_at=0, at_zero_since=None) is None
    # the committed offset moved: events flowed at 6 s
    assert decide(w, now=6, lag=0, committed={"g/t[0]": 9}, wake_at=0, at_zero_since=None) is None
    assert decide(w, now=15, lag=0, committed={"g/t[0]": 9}, wake_at=0, at_zero_since=None) is None
    # lag holds it up, as does the replicas' own lag and a sync call
    assert (
        decide(w, now=16.5, lag=3, committed={"g/t[0]": 9}, wake_at=0, at_zero_since=None) is None
    )
    assert (
        decide(
            w, now=26, lag=0, committed={"g/t[0]": 9}, wake_at=0, at_zero_since=None, replica_lag=1
        )
        is None
    )
    assert (
        decide(w, now=36, lag=0, committed={"g/t[0]": 9}, wake_at=0, at_zero_since=None) == "down"
    )


def test_at_zero_lag_or_a_sync_call_after_the_scale_down_wakes_the_pipeline() -> None:
    w = watched()
    c = {"g/t[0]": 9}
    assert decide(w, now=1, lag=0, committed=c, wake_at=100.0, at_zero_since=200.0) is None
    assert decide(w, now=2, lag=1, committed=c, wake_at=100.0, at_zero_since=200.0) == "up"
    w = watched()
    assert decide(w, now=2, lag=0, committed=c, wake_at=201.0, at_zero_since=200.0) == "up"


def test_replicas_min_0_scales_to_zero_and_its_settings_need_it() -> None:
    assert ReplicasConfig(min=0, max=2).scale_to_zero
    assert ReplicasConfig(min=0, max=2).idle_s == 300
    expect = "replicas.idle_s is set but replicas.min is 1; it applies to scale to zero only: set min: 0, or drop it"
    with pytest.raises(ValueError, match=re.escape(expect)):
        ReplicasConfig(min=1, max=2, idle_s=5)


def test_scale_to_zero_needs_the_replicas_to_consume() -> None:
    bad = doc({"min": 0, "max": 2})
    bad["spec"]["serving"]["source_placement"] = "actor"
    expect = "serving.replicas.min is 0 but source_placement is 'actor'"
    with pytest.raises(ValueError, match=re.escape(expect)):
        PipelineConfig.model_validate(bad)


def test_serve_runs_at_least_one_replica_until_the_controller_scales_to_zero() -> None:
    from eventbus.serving._deployment import build_app

    config = PipelineConfig.model_validate(doc({"min": 0, "max": 3}))
    assert autoscaling_options(config)["min_replicas"] == 1
    pinned = PipelineConfig.model_validate(doc({"min": 0, "max": 1}))
    opts = build_app(pinned, [])._bound_deployment._deployment_config.num_replicas
    assert opts == 1
    assert watched_of(config, "k:9092", None) is not None
    assert watched_of(PipelineConfig.model_validate(doc(1)), "k:9092", None) is None


def test_the_watch_covers_kafka_topics_and_the_ingress_topic_by_group() -> None:
    config = PipelineConfig.model_validate(
        doc({"min": 0, "max": 2}, [{"kafka": {"topic": ["a", "b"]}}, {"http": {}}])
    )
    w = watched_of(config, "k:9092", None)
    assert w is not None
    assert w.groups == {"k:9092": {"eventbus-orders": ["a", "b", "eventbus-ingress-orders"]}}


def test_status_shows_a_pipeline_at_zero_as_such() -> None:
    record = {"name": "orders", "version": 1, "document": doc({"min": 0, "max": 2})}
    view = pipeline_view(record, [], [["orders"]], scale={"since": 10.0, "last_event_at": 5.0})
    assert view["state"] == "SCALED_TO_ZERO"
    assert view["replicas"] == 0 and view["last_event_at"] == 5.0
    assert pipeline_view(record, [], [["orders"]])["state"] == "RUNNING"


class _Hanging:
    async def publish(self, pipeline: str, events: list[CloudEvent]) -> None:
        pass

    async def invoke(self, pipeline: str, events: list[CloudEvent]) -> list[Outcome]:
        await asyncio.Event().wait()  # no replica yet
        return []


def test_a_sync_call_at_zero_wakes_the_pipeline_and_gets_503_with_retry_after() -> None:
    table = RouteTable.from_documents(
        [doc({"min": 0, "max": 2}, [{"http": {"mode": "sync", "timeout_ms": 50}}])], {}
    )
    ingress = Ingress(_Hanging(), table)
    ingress.scaled_to_zero = frozenset({"orders"})
    woken: list[str] = []

    async def wake(name: str) -> None:
        woken.append(name)

    ingress.wake = wake
    event = CloudEvent.create(type="t", source="/s", id="1", data={})

    async def call() -> None:
        await ingress.invoke(table.http_route("orders"), [event])

    with pytest.raises(IngressError) as info:
        asyncio.run(call())
    assert woken == ["orders"]
    assert info.value.status == 503 and info.value.retry_after_s is not None
    assert "was scaled to zero (replicas.min: 0) and is starting" in info.value.message
    status, headers, _ = error_reply(info.value)
    assert status == 503 and ("retry-after", "5") in headers


class _Meta:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _Consumer:
    def __init__(self, ends: dict[Any, int]) -> None:
        self.ends = ends
        self.list_offsets: list[list[Any]] = []

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1}

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        self.list_offsets.append(list(tps))
        return {tp: self.ends.get((tp.topic, tp.partition), 0) for tp in tps}


class _Admin:
    def __init__(self, committed: dict[Any, int]) -> None:
        self.committed = committed
        self.fetches: list[str] = []

    async def list_consumer_group_offsets(self, group: str, partitions: list[Any]) -> dict:
        self.fetches.append(group)
        return {tp: _Meta(self.committed.get((tp.topic, tp.partition), -1)) for tp in partitions}


def test_the_watcher_reads_every_pipeline_at_zero_with_one_list_offsets() -> None:
    """50 pipelines at zero cost one ListOffsets per check, and no OffsetFetch once their
    committed offsets were read after the drain; running pipelines are read each time."""
    import time

    from eventbus.serving._scale_to_zero import REREAD_S, SETTLE_S, ScaleToZero

    names = [f"p{i}" for i in range(50)]
    consumer = _Consumer({("t-p3", 1): 7})  # p3: 7 records arrived while at zero
    admin = _Admin({("t-p3", 1): 5})
    watcher = ScaleToZero(None, lambda *a: None, "b:9092", None)
    watcher._consumers["b:9092"], watcher._admins["b:9092"] = consumer, admin
    ws = [Watched(n, {"b:9092": {f"g-{n}": [f"t-{n}"]}}, {}, idle_s=5, poll_s=1) for n in names]
    since = time.time() - 2 * SETTLE_S
    zero = dict.fromkeys(names[:-1], since)  # the last one runs

    first = asyncio.run(watcher.observe(ws, zero))
    assert len(consumer.list_offsets) == 1 and len(consumer.list_offsets[0]) == 100
    assert len(admin.fetches) == 50  # the first read after the drain: every group
    assert first["p3"] == (2, {"g-p3/t-p3[0]": 0, "g-p3/t-p3[1]": 5})
    assert first["p0"] == (0, {"g-p0/t-p0[0]": 0, "g-p0/t-p0[1]": 0})

    consumer.ends[("t-p7", 0)] = 3  # an event for p7 while at zero
    second = asyncio.run(watcher.observe(ws, zero))
    assert len(consumer.list_offsets) == 2
    assert admin.fetches[50:] == ["g-p49"], "only the running pipeline's group is fetched"
    assert second["p7"][0] == 3 and second["p3"][0] == 2

    for w in ws:  # after REREAD_S, the pipelines at zero are fetched again
        w.committed_read_at -= REREAD_S
    asyncio.run(watcher.observe(ws, zero))
    assert len(admin.fetches) == 101


def test_a_pipeline_just_at_zero_has_its_offsets_fetched_until_the_drain_settled() -> None:
    import time

    from eventbus.serving._scale_to_zero import ScaleToZero

    consumer, admin = _Consumer({}), _Admin({})
    watcher = ScaleToZero(None, lambda *a: None, "b:9092", None)
    watcher._consumers["b:9092"], watcher._admins["b:9092"] = consumer, admin
    w = Watched("p", {"b:9092": {"g": ["t"]}}, {}, idle_s=5, poll_s=1)
    for _ in range(3):
        asyncio.run(watcher.observe([w], {"p": time.time()}))
    assert admin.fetches == ["g", "g", "g"]


class _Hashes:
    """The two hashes the watcher reads each round (wake-ups, pipelines at zero)."""

    def __init__(self, zero: dict[str, float]) -> None:
        self.wake: dict[str, str] = {}
        self.zero = {n: f'{{"since": {s}}}' for n, s in zero.items()}

    def hgetall(self, key: str) -> dict[str, str]:
        from eventbus._internal import keys

        return dict(self.wake) if key == keys.WAKE else dict(self.zero)

    def hvals(self, key: str) -> list[str]:  # the running replicas' figures: none
        return []


def test_pipelines_at_zero_the_ringer_looked_at_are_left_to_it_until_anything_else_is_due() -> None:
    """With the ringer comparing every pipeline at zero with its partitions' ends each 0.2 s,
    the watcher's own ListOffsets for them (every poll_s, through aiokafka) would read the same
    again: it reads only the running ones, and a pipeline at zero when the ringer's look is
    stale, a sync call came, the ringer nudged it, or its committed offsets are due again."""
    import time

    from eventbus.serving._scale_to_zero import REREAD_S, SETTLE_S, ScaleToZero

    since = time.time() - 2 * SETTLE_S
    names = ["a", "b", "c", "d", "run"]
    redis = _Hashes(dict.fromkeys(names[:-1], since))
    consumer, admin = _Consumer({}), _Admin({})
    watcher = ScaleToZero(redis, lambda *a: None, "b:9092", None)
    watcher._consumers["b:9092"], watcher._admins["b:9092"] = consumer, admin
    ws = {n: Watched(n, {"b:9092": {f"g-{n}": [f"t-{n}"]}}, {}, idle_s=60, poll_s=1) for n in names}
    watcher._watched = dict(ws)

    def read_in_a_round() -> set[str]:
        for w in ws.values():
            w.next_at = 0.0
        consumer.list_offsets.clear()
        asyncio.run(watcher._tick(list(ws.values())))
        return {tp.topic[2:] for call in consumer.list_offsets for tp in call}

    assert read_in_a_round() == set(names), "no look of the ringer yet: the watcher reads all"
    assert set(watcher.wake_marks()) == set(names[:-1])  # read after the drain: the ringer's now
    watcher.looked(watcher.wake_marks(), 0.2)
    assert read_in_a_round() == {"run"}, "the ringer looked at the four at zero"

    ws["a"].looked_at -= 1.3  # the ringer has not looked for longer than poll_s + its pace
    redis.wake["b"] = str(time.time())  # a sync call through the gateway
    watcher.nudge("c")  # the ringer saw records wait
    assert read_in_a_round() == {"a", "b", "c", "run"}
    watcher.looked(["a", "b", "c"], 0.2)
    ws["d"].committed_read_at -= REREAD_S  # its committed offsets are read again
    redis.wake.pop("b")
    assert read_in_a_round() == {"d", "run"}
    watcher.looked(names[:-1], 2.0)  # a ringer slower than poll_s covers none
    assert read_in_a_round() == set(names)
