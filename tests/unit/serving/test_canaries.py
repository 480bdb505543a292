"""The canary reconciler (``serving._canaries``) on a real Redis, its deploy stood in for:
what a canary may change, how a tick advances, promotes and rolls back from the replicas'
figures, and that a canary of one pipeline waits for nothing held by another."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import yaml

from eventbus._internal import keys
from eventbus.errors import DeployError, PipelineNotFoundError
from eventbus.serving._canaries import Canaries
from eventbus.serving._deploys import not_deployed
from eventbus.serving._locks import PipelineLocks

WAIT_S = 60.0


def text(name: str, expr: str, sink: str = "out") -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": "in"}}],
                "steps": [{"id": "keep", "filter": expr}],
                "sink": {"kafka": {"topic": sink}},
            },
        }
    )


class Stage:
    """The deployed records (version 1 of each pipeline) and the deploys a promotion made."""

    def __init__(self, client: redis.Redis, locks: PipelineLocks) -> None:
        self.client = client
        self.locks = locks
        self.records: dict[str, dict[str, Any]] = {}
        self.deployed: list[tuple[str, str]] = []

    def current(self, name: str) -> dict[str, Any]:
        if name not in self.records:
            raise not_deployed(name)
        return self.records[name]

    def deploy(self, body: str, filename: str, python_path: list[str]) -> dict[str, Any]:
        name = yaml.safe_load(body)["metadata"]["name"]
        with self.locks.of(name):
            self.deployed.append((name, filename))
            return {"name": name, "version": self.records[name]["version"] + 1}

    def add(self, name: str) -> None:
        doc = yaml.safe_load(text(name, "data.n > 0"))
        self.records[name] = {"name": name, "version": 1, "document": doc}


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    yield r
    r.close()


@pytest.fixture
def names(client: redis.Redis) -> Iterator[list[str]]:
    made = [f"canary-{c}-{uuid.uuid4().hex[:8]}" for c in "ab"]
    yield made
    for name in made:
        client.delete(keys.canary(name), keys.canary_figures(name))


@pytest.fixture
def stage(client: redis.Redis, names: list[str]) -> Stage:
    s = Stage(client, PipelineLocks())
    for name in names:
        s.add(name)
    return s


def canaries(client: redis.Redis, stage: Stage) -> Canaries:
    return Canaries(client, stage.locks, stage.current, stage.deploy)


def start(c: Canaries, name: str, weights: list[int], **kw: Any) -> dict[str, Any]:
    kw.setdefault("step_s", 0.0)
    kw.setdefault("min_events", 10)
    return c.start(text(name, "data.n > 1"), "p.yaml", [], weights=weights, **kw)


def report(client: redis.Redis, name: str, stable: int, canary: int, failed: int = 0) -> None:
    """One replica's figures for the running canary: events so far per version."""
    state = json.loads(client.get(keys.canary(name)))  # type: ignore[arg-type]
    entry = {
        "canary_id": state["id"],
        "at": time.time(),
        "stable": {"events": stable, "failed": 0, "seconds": stable * 1e-5},
        "canary": {"events": canary, "failed": failed, "seconds": canary * 1e-5},
    }
    client.hset(keys.canary_figures(name), "replica-1", json.dumps(entry))


@pytest.mark.parametrize("weights", [[], [0, 100], [50, 10, 100], [10, 50], [10, 101]])
def test_weights_must_rise_to_100(
    client: redis.Redis, stage: Stage, names: list[str], weights: list[int]
) -> None:
    with pytest.raises(DeployError, match="must rise from above 0 to 100") as info:
        start(canaries(client, stage), names[0], weights)
    assert str(info.value).endswith(f"got {weights}")


def test_a_canary_changes_steps_only_and_only_one_runs(
    client: redis.Redis, stage: Stage, names: list[str]
) -> None:
    a, _ = names
    c = canaries(client, stage)
    with pytest.raises(PipelineNotFoundError, match="no pipeline named 'missing'"):
        start(c, "missing", [100])
    other_sink = text(a, "data.n > 1", sink="elsewhere")
    with pytest.raises(DeployError, match=r"may change its steps only, and sink differ"):
        c.start(other_sink, "p.yaml", [], weights=[100], step_s=1, min_events=1)
    same = text(a, "data.n > 0")
    with pytest.raises(DeployError, match="there is nothing to compare"):
        c.start(same, "p.yaml", [], weights=[100], step_s=1, min_events=1)
    info = start(c, a, [10, 100])
    assert info == {"name": a, "canary_version": 2, "weight": 10, "weights": [10, 100]}
    with pytest.raises(DeployError, match=r"is running \(at 10%\); `eventbus promote"):
        start(c, a, [100])
    status = c.status(a)
    assert status is not None and status["status"] == "running"
    assert not {"yaml", "document", "python_path", "baseline"} & set(status)


def test_a_healthy_canary_advances_then_is_promoted_by_a_deploy(
    client: redis.Redis, stage: Stage, names: list[str]
) -> None:
    a, _ = names
    c = canaries(client, stage)
    start(c, a, [50, 100])
    report(client, a, 0, 0)
    c.tick(a)  # the step's baseline
    c.tick(a)
    assert c.status(a)["weight"] == 50, "no events yet: it waits"  # type: ignore[index]
    report(client, a, 100, 100)
    c.tick(a)
    assert c.status(a)["weight"] == 100  # type: ignore[index]
    assert stage.deployed == []
    report(client, a, 200, 200)
    c.tick(a)
    assert stage.deployed == [(a, "p.yaml")]
    status = c.status(a)
    assert status is not None
    assert (status["status"], status["version"], status["weight"]) == ("promoted", 2, 0)
    assert [h["verdict"] for h in status["history"]] == ["advance", "advance"]
    assert not client.exists(keys.canary_figures(a)), "an ended canary's figures go"
    c.tick(a)  # ended: nothing more
    assert stage.deployed == [(a, "p.yaml")]


def test_a_regression_rolls_back_and_nothing_is_deployed(
    client: redis.Redis, stage: Stage, names: list[str]
) -> None:
    a, _ = names
    c = canaries(client, stage)
    start(c, a, [10, 100])
    report(client, a, 0, 0)
    c.tick(a)
    report(client, a, 900, 100, failed=30)
    c.tick(a)
    status = c.status(a)
    assert status is not None and status["status"] == "rolled_back"
    assert "at 10%: error rate 30.0%" in status["reason"]
    assert stage.deployed == []


def test_requests_roll_back_or_promote_the_running_canary_only(
    client: redis.Redis, stage: Stage, names: list[str]
) -> None:
    a, b = names
    c = canaries(client, stage)
    assert c.roll_back(a) is None, "no canary: the caller rolls back a version instead"
    with pytest.raises(PipelineNotFoundError, match=rf"no canary of '{a}' is running"):
        c.promote(a)
    start(c, a, [10, 100])
    assert c.roll_back(a) == {"name": a, "version": 1, "canary_rolled_back": 2}
    assert c.roll_back(a) is None
    start(c, b, [10, 100])
    assert c.promote(b) == {"name": b, "version": 2, "promoted": True}
    assert c.status(b)["reason"] == "promoted by request"  # type: ignore[index]


def test_a_canary_of_one_pipeline_is_promoted_while_another_pipeline_is_locked(
    client: redis.Redis, stage: Stage, names: list[str]
) -> None:
    a, b = names
    c = canaries(client, stage)
    start(c, b, [10, 100])
    held, release = threading.Event(), threading.Event()

    def deploying_a() -> None:  # a long deploy of a (its replicas starting)
        with stage.locks.of(a):
            held.set()
            release.wait(WAIT_S)

    t = threading.Thread(target=deploying_a, daemon=True)
    t.start()
    try:
        assert held.wait(WAIT_S)
        promoted = threading.Thread(target=c.promote, args=(b,), daemon=True)
        promoted.start()
        promoted.join(WAIT_S)
        assert not promoted.is_alive(), "b's promotion waited behind a's deploy"
        assert stage.deployed == [(b, "p.yaml")]
    finally:
        release.set()
    t.join(WAIT_S)
