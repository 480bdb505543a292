"""The pipeline reconciler (``serving._deploys``) on a real Redis, Serve stood in for by a
side that records what it ran: versions kept and forgotten, a failed redeploy putting the
last good version back, a delete forgetting every key of the pipeline, and one pipeline's
deploy not waiting for another's while its own delete does."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import yaml

from eventbus._internal import keys
from eventbus.errors import DeployError, PipelineNotFoundError
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._loader import load_pipeline_text
from eventbus.serving._deploys import KEEP_VERSIONS, Deploys
from eventbus.serving._locks import PipelineLocks

WAIT_S = 60.0


def text(name: str, expr: str = "data.n > 0") -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                # created at the first deploy on the session's broker (deploy checks topics)
                "sources": [{"kafka": {"topic": "deploys-in", "create": {"partitions": 1}}}],
                "steps": [{"id": "keep", "filter": expr}],
                "sink": {"kafka": {"topic": "deploys-out", "create": {"partitions": 1}}},
            },
        }
    )


class Pace:
    @contextmanager
    def running(self) -> Iterator[None]:
        yield


class Side:
    """Serve, models and the watcher: notes what each was asked, in order. A run whose
    filter is ``fail`` raises as a replica's constructor would; a run of a pipeline in
    ``held`` waits until the test lets it go."""

    def __init__(self) -> None:
        self.pace = Pace()
        self.done: list[str] = []
        self.held: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}

    def runtime(self, *, run_sources: bool) -> dict[str, Any]:
        return {}

    def running(self) -> set[str]:
        return set()

    def run(self, config: PipelineConfig, python_path: list[str]) -> None:
        expr = config.to_document()["spec"]["steps"][0]["filter"]
        self.done.append(f"run {config.name} {json.dumps(expr)}")
        if config.name in self.held:
            self.entered[config.name].set()
            assert self.held[config.name].wait(WAIT_S)
        if "fail" in expr:
            msg = "Traceback (most recent call last):\n  ...\nValueError: the broker refused"
            raise RuntimeError(msg)

    def delete(self, name: str, *, own_only: bool = False) -> None:
        self.done.append(f"delete {name}")

    def ensure_apps(self, config: PipelineConfig, *, running: set[str]) -> list[str]:
        return []

    def release(self, pipeline: str, documents: list[dict[str, Any]]) -> None:
        names = sorted(d["metadata"]["name"] for d in documents)
        self.done.append(f"release {pipeline} of {names}")

    def track(self, config: PipelineConfig) -> None:
        self.done.append(f"track {config.name}")

    def forget(self, name: str) -> None:
        self.done.append(f"forget {name}")


@pytest.fixture(autouse=True)
def _broker(kafka_bootstrap: str) -> None:
    global BOOTSTRAP  # the session's broker, for reconciler()
    BOOTSTRAP = kafka_bootstrap


BOOTSTRAP = ""


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    yield r
    r.close()


@pytest.fixture
def names(client: redis.Redis) -> Iterator[list[str]]:
    made = [f"deploys-{c}-{uuid.uuid4().hex[:8]}" for c in "ab"]
    yield made
    for name in made:
        client.hdel(keys.PIPELINES, name)
        client.delete(keys.pipeline_versions(name))


def reconciler(client: redis.Redis, side: Side) -> Deploys:
    return Deploys(client, side, side, side, PipelineLocks(), BOOTSTRAP, None)  # type: ignore[arg-type]


def deploy(d: Deploys, body: str) -> dict[str, Any]:
    config = load_pipeline_text(body, "p.yaml", check_functions=False)
    with d.locks.of(config.name):
        return d.apply(config, body, "p.yaml", [])


def test_versions_are_kept_newest_first_and_the_oldest_forgotten(
    client: redis.Redis, names: list[str]
) -> None:
    a, _ = names
    d = reconciler(client, Side())
    assert deploy(d, text(a)) == {"name": a, "version": 1, "sources": 1, "steps": 1}
    for n in range(2, KEEP_VERSIONS + 4):
        assert deploy(d, text(a, f"data.n > {n}"))["version"] == n
    kept = d.versions(a)
    last = KEEP_VERSIONS + 3
    assert [v["version"] for v in kept] == list(range(last, 3, -1))
    assert [v["serving"] for v in kept] == [True] + [False] * (KEEP_VERSIONS - 1)
    assert d.kept(a, None)["version"] == last - 1
    assert yaml.safe_load(d.kept(a, 4)["yaml"])["spec"]["steps"][0]["filter"] == "data.n > 4"
    with pytest.raises(PipelineNotFoundError, match=r"has no kept version 3 \(kept: \[4, 5,"):
        d.kept(a, 3)
    with pytest.raises(PipelineNotFoundError, match="no pipeline named 'nope' is deployed"):
        d.versions("nope")


def test_the_first_version_has_none_before_it(client: redis.Redis, names: list[str]) -> None:
    a, _ = names
    d = reconciler(client, Side())
    deploy(d, text(a))
    with pytest.raises(PipelineNotFoundError, match="has no version before 1 to roll back to"):
        d.kept(a, None)


def test_a_failed_redeploy_puts_the_last_good_version_back(
    client: redis.Redis, names: list[str]
) -> None:
    a, _ = names
    side = Side()
    d = reconciler(client, side)
    deploy(d, text(a, "data.n > 1"))
    side.done.clear()
    with pytest.raises(DeployError) as info:
        deploy(d, text(a, "data.fail > 1"))
    assert (
        str(info.value) == f"pipeline {a!r} could not be deployed: ValueError: the broker refused"
    )
    assert side.done == [f'run {a} "data.fail > 1"', f'run {a} "data.n > 1"']
    assert d.get(a)["version"] == 1
    assert [v["version"] for v in d.versions(a)] == [1]


def test_a_failed_first_deploy_leaves_nothing(client: redis.Redis, names: list[str]) -> None:
    a, _ = names
    side = Side()
    d = reconciler(client, side)
    with pytest.raises(DeployError, match="ValueError: the broker refused"):
        deploy(d, text(a, "data.fail > 1"))
    assert side.done == [f'run {a} "data.fail > 1"', f"delete {a}"]
    assert d.load(a) is None


def test_a_delete_forgets_every_key_of_the_pipeline(client: redis.Redis, names: list[str]) -> None:
    a, b = names
    side = Side()
    d = reconciler(client, side)
    deploy(d, text(a))
    deploy(d, text(b))
    for key in (keys.SCALED_TO_ZERO, keys.WAKE):
        client.hset(key, a, "{}")
    client.set(keys.canary(a), "{}")
    client.hset(keys.canary_figures(a), "r", "{}")
    side.done.clear()
    d.delete(a)
    # the models are released knowing the deleted pipeline's document and the others'
    # (the session's Redis may hold other tests' pipelines: the release names them too)
    deleted, release, forgot = side.done
    assert (deleted, forgot) == (f"delete {a}", f"forget {a}")
    assert release.startswith(f"release {a} of [") and f"'{a}'" in release and f"'{b}'" in release
    assert d.load(a) is None and d.load(b) is not None
    assert not client.hexists(keys.SCALED_TO_ZERO, a) and not client.hexists(keys.WAKE, a)
    assert not client.exists(keys.pipeline_versions(a), keys.canary(a), keys.canary_figures(a))
    with pytest.raises(PipelineNotFoundError, match=rf"no pipeline named '{a}' is deployed"):
        d.delete(a)


def test_a_deploy_waits_for_nothing_of_another_pipeline_and_a_delete_for_its_own_deploy(
    client: redis.Redis, names: list[str]
) -> None:
    a, b = names
    side = Side()
    d = reconciler(client, side)
    deploy(d, text(a))
    side.held[a], side.entered[a] = threading.Event(), threading.Event()
    slow = threading.Thread(target=deploy, args=(d, text(a, "data.n > 2")), daemon=True)
    slow.start()
    try:
        assert side.entered[a].wait(WAIT_S), "a's redeploy never started its replicas"
        other = threading.Thread(target=deploy, args=(d, text(b)), daemon=True)
        other.start()
        other.join(WAIT_S)
        assert not other.is_alive(), "b's deploy waited behind a's"
        assert d.get(b)["version"] == 1
        gone = threading.Thread(target=d.delete, args=(a,), daemon=True)
        gone.start()
        gone.join(0.5)  # it cannot get through while a's deploy holds a's lock, however long
        assert gone.is_alive(), f"a's delete ran during its deploy: {side.done}"
    finally:
        side.held[a].set()
    for t in (slow, gone):
        t.join(WAIT_S)
        assert not t.is_alive()
    assert side.done.index(f"track {a}") < side.done.index(f"delete {a}")
    assert d.load(a) is None, "the delete came after the deploy, and won"
