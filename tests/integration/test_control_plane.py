"""The control plane on the real stack: the controller killed under load, versions, rollback."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import ray

from eventbus.serving._controller import CONTROLLER_NAME, NAMESPACE
from tests.integration.kafka_helpers import collect
from tests.integration.test_faults import (
    N,
    check_exactly_once_in_key_order,
    doc,
    produce_paced,
    replica_pid,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]


def controller_pid() -> int:
    actor = ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
    return int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60))


def wait_for(condition: Any, timeout_s: float = 90.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:
            last = e
        time.sleep(0.2)
    msg = f"timed out waiting for {what} (last error: {last!r})"
    raise AssertionError(msg)


async def test_controller_killed_under_load_loses_nothing_and_restarts_no_application(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, eventbus_client: Any
) -> None:
    src, sink, dlq = (
        topic_factory("c-in", partitions=4),
        topic_factory("c-out", partitions=4),
        topic_factory("c-dlq"),
    )
    name = f"ctl-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(doc(name, src, sink, dlq))
    replica = await asyncio.to_thread(replica_pid, name)
    victim = await asyncio.to_thread(controller_pid)
    progress = [0]
    producer = asyncio.create_task(produce_paced(kafka_bootstrap, src, N, 6.0, progress))
    while progress[0] < N * 0.4:
        await asyncio.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    await producer
    out = await collect(kafka_bootstrap, sink, N, timeout_s=180)
    check_exactly_once_in_key_order(out, {f"f{i}" for i in range(N)})
    # Ray restarted the controller; it restored its state from Redis and adopted the running
    # application instead of redeploying it.
    assert await asyncio.to_thread(
        wait_for, lambda: controller_pid() != victim, 90, "the controller to restart"
    )
    listed = await asyncio.to_thread(eventbus_client.list)
    assert [p["status"] for p in listed if p["name"] == name] == ["RUNNING"]
    assert await asyncio.to_thread(replica_pid, name) == replica


def filter_doc(name: str, src: str, sink: str, expr: str) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": src}}],
            "steps": [{"id": "keep", "filter": expr}],
            "sink": {"kafka": {"topic": sink}},
        },
    }


async def test_versions_rollback_and_the_admin_api(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, eventbus_client: Any
) -> None:
    import httpx
    import yaml
    from fastapi import FastAPI

    from eventbus import CloudEvent
    from eventbus.gateway._admin import add_admin_routes
    from tests.integration.kafka_helpers import produce

    src, sink = topic_factory("v-in", partitions=2), topic_factory("v-out")
    name = f"ver-{uuid.uuid4().hex[:6]}"
    sent = [0]

    async def outputs_of_next_twelve(expected: int) -> list[int]:
        """Twelve more events (n = sent..sent+11) through the live version: the n that pass."""
        base = sent[0]
        sent[0] += 12
        await produce(
            kafka_bootstrap,
            src,
            [
                CloudEvent.create(type="t", source="/v", id=f"v{i}", data={"n": i})
                for i in range(base, base + 12)
            ],
        )
        out = await collect(kafka_bootstrap, sink, expected)
        return sorted(e.data["n"] - base for e in out if e.data["n"] >= base)

    deploy_pipeline(filter_doc(name, src, sink, "data.n % 2 == 0"))
    assert await outputs_of_next_twelve(6) == [0, 2, 4, 6, 8, 10]
    deploy_pipeline(filter_doc(name, src, sink, "data.n % 3 == 0"))
    assert await outputs_of_next_twelve(6 + 4) == [0, 3, 6, 9]
    versions = await asyncio.to_thread(eventbus_client.versions, name)
    assert [(v["version"], v["serving"]) for v in versions] == [(2, True), (1, False)]

    info = await asyncio.to_thread(eventbus_client.rollback, name)
    assert (info["version"], info["rollback_of"]) == (3, 1)
    assert await outputs_of_next_twelve(6 + 4 + 6) == [
        0,
        2,
        4,
        6,
        8,
        10,
    ]  # version 1's filter serves again

    app = FastAPI()
    add_admin_routes(app, "s3cret")
    auth = {"Authorization": "Bearer s3cret"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gw"
    ) as http:
        assert (await http.get("/v1/admin/pipelines")).status_code == 401
        assert (
            await http.get("/v1/admin/pipelines", headers={"Authorization": "Bearer nope"})
        ).status_code == 401
        listed = (await http.get("/v1/admin/pipelines", headers=auth)).json()
        assert [p["version"] for p in listed if p["name"] == name] == [3]
        r = await http.get(f"/v1/admin/pipelines/{name}/versions", headers=auth)
        assert [(v["version"], v["rollback_of"]) for v in r.json()] == [
            (3, 1),
            (2, None),
            (1, None),
        ]
        r = await http.post(f"/v1/admin/pipelines/{name}/rollback", params={"to": 2}, headers=auth)
        assert r.status_code == 200 and r.json()["version"] == 4
        assert (await http.get(f"/v1/admin/pipelines/{name}", headers=auth)).json()["document"][
            "spec"
        ]["steps"][0]["filter"] == "data.n % 3 == 0"
        r = await http.post(f"/v1/admin/pipelines/{name}/rollback", params={"to": 99}, headers=auth)
        assert r.status_code == 404 and "no kept version 99" in r.json()["error"]
        bad = yaml.safe_dump({**filter_doc(name, src, sink, "data.n %"), "kind": "Pipeline"})
        r = await http.post("/v1/admin/pipelines", content=bad, headers=auth)
        assert r.status_code == 422 and r.json()["problems"], r.text
        status = (await http.get(f"/v1/admin/pipelines/{name}/status", headers=auth)).json()
        assert status["version"] == 4
        assert (await http.delete(f"/v1/admin/pipelines/{name}", headers=auth)).status_code == 204
        r = await http.get(f"/v1/admin/pipelines/{name}", headers=auth)
        assert r.status_code == 404 and name in r.json()["error"]
    off = FastAPI()
    add_admin_routes(off, None)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=off), base_url="http://gw"
    ) as http:
        r = await http.get("/v1/admin/pipelines", headers=auth)
        assert r.status_code == 404 and "EVENTBUS_ADMIN_TOKEN" in r.json()["error"]


def tagging(tag: str) -> list[dict[str, Any]]:
    return [{"id": "tag", "convert": {"set": {"data.seen": "true", "data.version": f"'{tag}'"}}}]


CANARY_N = 8000


async def run_canary(
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    eventbus_client: Any,
    tmp_path: Any,
    canary_steps: list[dict[str, Any]],
    until: str,
) -> tuple[list[Any], list[Any], dict[str, Any], str]:
    """Version 1 tags events 'v1'; under a steady load a canary of ``canary_steps`` starts
    (10/50/100 %, 2 s steps); waits until the canary's status is ``until``; returns the sink
    events, the dead letters, the canary's final state and the pipeline name."""
    import yaml

    src, sink, dlq = (
        topic_factory("k-in", partitions=4),
        topic_factory("k-out", partitions=4),
        topic_factory("k-dlq"),
    )
    name = f"canary-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(doc(name, src, sink, dlq, steps=tagging("v1")))
    progress = [0]
    producer = asyncio.create_task(produce_paced(kafka_bootstrap, src, CANARY_N, 16.0, progress))
    while progress[0] < CANARY_N * 0.15:
        await asyncio.sleep(0.05)
    path = tmp_path / f"{name}-canary.yaml"
    path.write_text(yaml.safe_dump(doc(name, src, sink, dlq, steps=canary_steps), sort_keys=False))
    info = await asyncio.to_thread(
        eventbus_client.deploy, path, canary=[10, 50, 100], step_s=2.0, min_events=20
    )
    assert info["weight"] == 10 and info["canary_version"] == 2
    state = await asyncio.to_thread(
        wait_for,
        lambda: (s := eventbus_client.canary(name)) and s["status"] != "running" and s,
        120,
        f"the canary to be {until}",
    )
    assert state["status"] == until, state
    await producer
    dead = await collect(kafka_bootstrap, dlq, 1, timeout_s=60) if until != "promoted" else []
    out = await collect(kafka_bootstrap, sink, CANARY_N - len(dead), timeout_s=180)
    return out, dead, state, name


async def test_canary_promoted_under_load_loses_nothing(
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    eventbus_client: Any,
    tmp_path: Any,
) -> None:
    out, _, state, name = await run_canary(
        deploy_pipeline,
        topic_factory,
        kafka_bootstrap,
        eventbus_client,
        tmp_path,
        tagging("v2"),
        "promoted",
    )
    check_exactly_once_in_key_order(out, {f"f{i}" for i in range(CANARY_N)})
    versions = Counter(e.data["version"] for e in out)
    assert versions["v1"] > 0 and versions["v2"] > 0, versions
    assert [h["weight"] for h in state["history"]] == [10, 50, 100] and all(
        h["verdict"] == "advance" for h in state["history"]
    )
    assert [p["version"] for p in eventbus_client.list() if p["name"] == name] == [2]
    # events after the promotion are all the new version's
    last = [e for e in out if e.data["n"] >= CANARY_N - 200]
    assert {e.data["version"] for e in last} == {"v2"}


async def test_canary_with_a_regression_is_rolled_back_under_load(
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    eventbus_client: Any,
    tmp_path: Any,
) -> None:
    broken = [
        {
            "id": "tag",
            "convert": {
                "set": {
                    "data.seen": "true",
                    "data.version": "'v2'",
                    "data.ratio": "data.n / (data.n - data.n)",
                }
            },
        }
    ]
    out, dead, state, name = await run_canary(
        deploy_pipeline,
        topic_factory,
        kafka_bootstrap,
        eventbus_client,
        tmp_path,
        broken,
        "rolled_back",
    )
    assert "error rate" in state["reason"] and state["reason"].startswith("at 10%"), state
    assert [p["version"] for p in eventbus_client.list() if p["name"] == name] == [1]
    # Nothing lost: every event is in the sink (v1) or, failed by the canary, dead-lettered.
    ids = Counter(e.id for e in out) + Counter(e.id for e in dead)
    assert set(ids) == {f"f{i}" for i in range(CANARY_N)} and max(ids.values()) == 1
    assert {e.data["version"] for e in out} == {"v1"}
    assert all(e["ebstep"] == "tag" for e in dead)


async def test_two_pipelines_with_conflicting_package_versions_run_side_by_side(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str
) -> None:
    """Each pipeline's runtime_env installs its own version of a package the project does
    not have; both serve at once, each with its own version and environment variables."""
    from eventbus import CloudEvent
    from tests.integration.kafka_helpers import produce

    outputs = {}
    names = {}
    for version in ("0.9.0", "0.8.10"):
        src, sink = topic_factory("iso-in"), topic_factory("iso-out")
        name = f"iso-{version.replace('.', '')}-{uuid.uuid4().hex[:4]}"
        deploy_pipeline(
            {
                "apiVersion": "eventbus/v1",
                "kind": "Pipeline",
                "metadata": {"name": name},
                "spec": {
                    "sources": [{"kafka": {"topic": src}}],
                    "steps": [{"id": "tag", "function": "tests.integration.funcs:package_version"}],
                    "sink": {"kafka": {"topic": sink}},
                    "serving": {
                        "memory_mb": 256,
                        "runtime_env": {
                            "pip": [f"tabulate=={version}"],
                            "env_vars": {"EB_TAG": name},
                        },
                    },
                },
            }
        )
        names[version] = name
        outputs[version] = (src, sink)
    for version, (src, sink) in outputs.items():
        await produce(
            kafka_bootstrap,
            src,
            [
                CloudEvent.create(type="t", source="/iso", id=f"i{i}", data={"n": i})
                for i in range(5)
            ],
        )
    for version, (src, sink) in outputs.items():
        out = await collect(kafka_bootstrap, sink, 5, timeout_s=120)
        assert {(e.data["tabulate"], e.data["tag"]) for e in out} == {(version, names[version])}
