"""The control plane on the real stack: the controller killed under load, versions, rollback."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from typing import Any

import pytest
import ray

from eventbus.serving._controller import CONTROLLER_NAME, NAMESPACE
from tests.integration.kafka_helpers import collect
from tests.integration.test_faults import N, check_exactly_once_in_key_order, doc, produce_paced, replica_pid

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis, pytest.mark.slow]


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
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(0.2)
    msg = f"timed out waiting for {what} (last error: {last!r})"
    raise AssertionError(msg)


async def test_controller_killed_under_load_loses_nothing_and_restarts_no_application(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, eventbus_client: Any
) -> None:
    src, sink, dlq = topic_factory("c-in", partitions=4), topic_factory("c-out", partitions=4), topic_factory("c-dlq")
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
    assert await asyncio.to_thread(wait_for, lambda: controller_pid() != victim, 90, "the controller to restart")
    listed = await asyncio.to_thread(eventbus_client.list)
    assert [p["status"] for p in listed if p["name"] == name] == ["RUNNING"]
    assert await asyncio.to_thread(replica_pid, name) == replica


def filter_doc(name: str, src: str, sink: str, expr: str) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {"sources": [{"kafka": {"topic": src}}], "steps": [{"id": "keep", "filter": expr}], "sink": {"kafka": {"topic": sink}}},
    }


async def test_versions_rollback_and_the_admin_api(deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, eventbus_client: Any) -> None:
    import httpx
    import yaml
    from fastapi import FastAPI

    from eventbus import CloudEvent
    from eventbus.serving._admin import add_admin_routes
    from tests.integration.kafka_helpers import produce

    src, sink = topic_factory("v-in", partitions=2), topic_factory("v-out")
    name = f"ver-{uuid.uuid4().hex[:6]}"
    sent = [0]

    async def outputs_of_next_twelve(expected: int) -> list[int]:
        """Twelve more events (n = sent..sent+11) through the live version: the n that pass."""
        base = sent[0]
        sent[0] += 12
        await produce(kafka_bootstrap, src, [CloudEvent.create(type="t", source="/v", id=f"v{i}", data={"n": i}) for i in range(base, base + 12)])
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
    assert await outputs_of_next_twelve(6 + 4 + 6) == [0, 2, 4, 6, 8, 10]  # version 1's filter serves again

    app = FastAPI()
    add_admin_routes(app, "s3cret")
    auth = {"Authorization": "Bearer s3cret"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        assert (await http.get("/v1/admin/pipelines")).status_code == 401
        assert (await http.get("/v1/admin/pipelines", headers={"Authorization": "Bearer nope"})).status_code == 401
        listed = (await http.get("/v1/admin/pipelines", headers=auth)).json()
        assert [p["version"] for p in listed if p["name"] == name] == [3]
        r = await http.get(f"/v1/admin/pipelines/{name}/versions", headers=auth)
        assert [(v["version"], v["rollback_of"]) for v in r.json()] == [(3, 1), (2, None), (1, None)]
        r = await http.post(f"/v1/admin/pipelines/{name}/rollback", params={"to": 2}, headers=auth)
        assert r.status_code == 200 and r.json()["version"] == 4
        assert (await http.get(f"/v1/admin/pipelines/{name}", headers=auth)).json()["document"]["spec"]["steps"][0]["filter"] == "data.n % 3 == 0"
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
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=off), base_url="http://gw") as http:
        r = await http.get("/v1/admin/pipelines", headers=auth)
        assert r.status_code == 404 and "EVENTBUS_ADMIN_TOKEN" in r.json()["error"]
