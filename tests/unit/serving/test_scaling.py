"""The scaling reconciler (``serving._scaling``) on a real Redis, with a Serve side that
records what it was asked and can hold a scale-down mid-drain: one lock per pipeline, so a
wake-up of one pipeline runs while another's scale-down drains, and two actions on one
pipeline never overlap. Proved by the order of what ran, not by timing."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from eventbus._internal import keys
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._locks import PipelineLocks
from eventbus.serving._scaling import Scaling

WAIT_S = 60.0  # for a thread that must get through: generous, only a hung test waits it out


def document(name: str, replicas: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            # another cluster than the stack's: no join bridge, no broker asked
            "sources": [{"kafka": {"topic": "in", "bootstrap_servers": "elsewhere:9092"}}],
            "steps": [],
            "sink": {"kafka": {"topic": "out"}},
            "serving": {"replicas": replicas},
        },
    }


class HeldApps:
    """The Serve side: notes each run and delete in order; a delete of a pipeline in
    ``held`` waits (as a drain does) until the test lets it go."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.held: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def hold(self, name: str) -> None:
        self.held[name] = threading.Event()
        self.entered[name] = threading.Event()

    def _note(self, what: str) -> None:
        with self._lock:
            self.done.append(what)

    def run(self, config: PipelineConfig, python_path: list[str]) -> None:
        self._note(f"run {config.name}")

    def delete(self, name: str, *, own_only: bool = False) -> None:
        self._note(f"delete {name} begun")
        if name in self.held:
            self.entered[name].set()
            assert self.held[name].wait(WAIT_S), "the test never let the drain end"
        self._note(f"delete {name} ended")


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    yield r
    r.close()


@pytest.fixture
def names(client: redis.Redis) -> Iterator[list[str]]:
    """Two fresh pipeline names (a, b), their records removed after the test."""
    made = [f"scaling-{c}-{uuid.uuid4().hex[:8]}" for c in "ab"]
    yield made
    for name in made:
        client.hdel(keys.PIPELINES, name)
        client.hdel(keys.SCALED_TO_ZERO, name)


def deployed(client: redis.Redis, name: str, replicas: dict[str, Any] | None = None) -> None:
    doc = document(name, replicas or {"min": 0, "max": 1, "idle_s": 30})
    record = {"name": name, "version": 1, "document": doc, "python_path": []}
    client.hset(keys.PIPELINES, name, json.dumps(record))


def at_zero(client: redis.Redis, name: str) -> dict[str, Any] | None:
    raw = client.hget(keys.SCALED_TO_ZERO, name)
    return json.loads(raw) if raw else None


def scaling(client: redis.Redis, apps: HeldApps) -> Scaling:
    def load(name: str) -> dict[str, Any] | None:
        raw = client.hget(keys.PIPELINES, name)
        return json.loads(raw) if raw else None

    return Scaling(client, apps, PipelineLocks(), load, "stack:9092", None)  # type: ignore[arg-type]


def config_of(client: redis.Redis, name: str) -> PipelineConfig:
    return PipelineConfig.model_validate(json.loads(client.hget(keys.PIPELINES, name))["document"])  # type: ignore[arg-type]


def started(target: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def test_a_wake_of_one_pipeline_runs_while_another_pipeline_drains(
    client: redis.Redis, names: list[str]
) -> None:
    a, b = names
    deployed(client, a)
    deployed(client, b)
    client.hset(keys.SCALED_TO_ZERO, a, json.dumps({"since": 1.0, "last_event_at": 1.0}))
    apps = HeldApps()
    apps.hold(b)
    s = scaling(client, apps)
    down = started(s.scale, b, True, 2.0, "poll")
    try:
        assert apps.entered[b].wait(WAIT_S), "b's scale-down never reached its drain"
        wake = started(s.wake, config_of(client, a))
        wake.join(WAIT_S)
        assert not wake.is_alive(), f"the wake of {a} waited behind {b}'s scale-down: {apps.done}"
        # a runs again while b's drain has not ended
        assert apps.done == [f"delete {b} begun", f"run {a}"]
        assert at_zero(client, a) is None
        state_b = at_zero(client, b)
        assert state_b is not None and state_b["last_event_at"] == 2.0
        assert "settled_at" not in state_b, "b's drain had not ended: not settled yet"
    finally:
        apps.held[b].set()
    down.join(WAIT_S)
    assert not down.is_alive()
    assert apps.done[-1] == f"delete {b} ended"
    settled = at_zero(client, b)
    assert settled is not None and settled["settled_at"] >= settled["since"]


def test_a_wake_of_a_pipeline_waits_for_its_own_scale_down_to_end(
    client: redis.Redis, names: list[str]
) -> None:
    a, _ = names
    deployed(client, a)
    apps = HeldApps()
    apps.hold(a)
    s = scaling(client, apps)
    down = started(s.scale, a, True, 2.0, "poll")
    try:
        assert apps.entered[a].wait(WAIT_S)
        up = started(s.scale, a, False, 3.0, "doorbell")
        up.join(0.5)  # it cannot get through while a's drain holds a's lock, however long
        assert up.is_alive(), f"the wake-up ran during the pipeline's own drain: {apps.done}"
        assert apps.done == [f"delete {a} begun"]
    finally:
        apps.held[a].set()
    for thread in (down, up):
        thread.join(WAIT_S)
        assert not thread.is_alive()
    # a serve.run of an application being deleted would never return: strictly after it
    assert apps.done == [f"delete {a} begun", f"delete {a} ended", f"run {a}"]
    assert at_zero(client, a) is None


def test_concurrent_wakes_of_a_pipeline_at_zero_run_it_once(
    client: redis.Redis, names: list[str]
) -> None:
    a, _ = names
    deployed(client, a)
    client.hset(keys.SCALED_TO_ZERO, a, json.dumps({"since": 1.0, "last_event_at": 1.0}))
    apps = HeldApps()
    s = scaling(client, apps)
    config = config_of(client, a)
    answers: list[bool] = []
    go = threading.Barrier(8)

    def wake() -> None:
        go.wait(WAIT_S)
        answers.append(s.wake(config))

    threads = [started(wake) for _ in range(8)]
    for thread in threads:
        thread.join(WAIT_S)
        assert not thread.is_alive()
    assert apps.done == [f"run {a}"]
    assert answers.count(True) >= 1
    assert at_zero(client, a) is None
    assert s.wake(config) is False, "a pipeline that runs is not woken"
    assert apps.done == [f"run {a}"]


def test_decisions_for_a_deleted_pipeline_or_one_without_min_0_change_nothing(
    client: redis.Redis, names: list[str]
) -> None:
    a, b = names
    deployed(client, b, {"min": 1, "max": 2})  # redeployed without min: 0 meanwhile
    apps = HeldApps()
    s = scaling(client, apps)
    s.scale(a, True, 1.0)  # a: deleted meanwhile
    s.scale(b, True, 1.0)
    assert apps.done == []
    assert at_zero(client, a) is None and at_zero(client, b) is None
    deployed(client, a)
    s.scale(a, False, 1.0)  # it runs: nothing to wake
    assert apps.done == []


def test_a_scale_down_right_after_a_wake_waits_for_a_full_idle_time(
    client: redis.Redis, names: list[str]
) -> None:
    a, _ = names
    deployed(client, a)  # idle_s 30
    client.hset(keys.SCALED_TO_ZERO, a, json.dumps({"since": 1.0, "last_event_at": 1.0}))
    apps = HeldApps()
    s = scaling(client, apps)
    assert s.wake(config_of(client, a)) is True
    # the watcher's decision was made on an idle time that began before the cold start ended
    s.scale(a, True, 1.0)
    assert apps.done == [f"run {a}"]
    assert at_zero(client, a) is None
