"""Shared hosts on the real stack (``serving.host``): two pipelines in the replica of one
Serve application both deliver, each as its own pipeline (status, list); a redeploy of one
keeps the other's events flowing with nothing lost and its process and sources untouched; a
member whose function raises dead-letters its own events only; a member that cannot start
fails its deploy and leaves the host running; a controller killed with SIGKILL finds the
membership in Redis; undeploying one leaves the other running, and moving the last one off
the host into replicas of its own takes the host away; a setting a shared process cannot hold
is refused at deploy, before anything runs."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from eventbus import CloudEvent
from eventbus.errors import DeployError, PipelineConfigError
from tests.integration.kafka_helpers import collect, produce
from tests.integration.test_autoscaling import wait_for
from tests.integration.test_control_plane import controller_pid

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]


def member(name: str, host: str, src: str, sink: str, dlq: str, factor: int) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": src}}],
            "steps": [
                {"id": "scale", "convert": {"set": {"data.m": f"data.n * {factor}"}}},
                {"id": "score", "function": "tests.integration.funcs:score"},
            ],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "serving": {"host": host, "replicas": 1, "batch": {"linger_ms": 5}},
        },
    }


def batch(tag: str, start: int, n: int) -> list[CloudEvent]:
    return [
        CloudEvent.create(type="n.created", source="/host", id=f"{tag}{i}", data={"n": i})
        for i in range(start, start + n)
    ]


async def host_call(host: str, method: str) -> Any:
    from ray import serve

    handle: Any = serve.get_app_handle(f"eventbus-host-{host}")
    return await getattr(handle, method).remote()


def apps() -> set[str]:
    from ray import serve

    return set(serve.status().applications)


async def test_two_pipelines_share_one_host_redeploy_and_undeploy_one(
    deploy_pipeline: Any,
    eventbus_client: Any,
    kafka_bootstrap: str,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:6]
    host, a, b = f"h{tag}", f"ha-{tag}", f"hb-{tag}"
    t = {k: topic_factory(f"host-{k}") for k in ("a-in", "a-out", "b-in", "b-out", "dlq")}
    deploy_pipeline(member(a, host, t["a-in"], t["a-out"], t["dlq"], 2))
    deploy_pipeline(member(b, host, t["b-in"], t["b-out"], t["dlq"], 3))

    # one Serve application, no application of either pipeline; each listed as itself
    assert f"eventbus-host-{host}" in apps()
    assert {f"eventbus-{a}", f"eventbus-{b}"} & apps() == set()
    rows = {r["name"]: r for r in eventbus_client.list()}
    assert rows[a]["status"] == rows[b]["status"] == "RUNNING"
    pid = (await host_call(host, "stats"))["pid"]
    stamps = await host_call(host, "members")
    assert set(stamps) == {a, b} and all(m["error"] is None for m in stamps.values())

    # both deliver; a raising function dead-letters that member's events only (n % 500 == 7)
    await produce(kafka_bootstrap, t["a-in"], batch("a", 0, 600))
    await produce(kafka_bootstrap, t["b-in"], batch("b", 0, 600))
    out_a = await collect(kafka_bootstrap, t["a-out"], 598)
    out_b = await collect(kafka_bootstrap, t["b-out"], 598)
    bad = {7, 507}
    assert {e.id for e in out_a} == {f"a{i}" for i in range(600) if i not in bad}
    assert {e.data["m"] for e in out_b} == {3 * i for i in range(600) if i not in bad}
    dead = await collect(kafka_bootstrap, t["dlq"], 4)
    assert {(e["ebpipeline"], e.id) for e in dead} == {
        (a, "a7"),
        (a, "a507"),
        (b, "b7"),
        (b, "b507"),
    }
    assert all(e["eberrortype"] == "ValueError" for e in dead)
    # each member's own figures: status reads them as any pipeline's
    for name in (a, b):
        await wait_for(
            lambda n=name: eventbus_client.status(n)["sources"][0].get("consumed") == 600,
            15,
            f"the figures of {name}",
        )
        assert eventbus_client.status(name)["figures"]["replicas"] == 1

    # redeploy A (factor 5) while B's events keep coming: B loses nothing, its process and
    # its member (stamp) are untouched; A's next events take the new version
    async def feed_b() -> None:
        for k in range(10):
            await produce(kafka_bootstrap, t["b-in"], batch("b", 1000 + 100 * k, 100))
            await asyncio.sleep(0.1)

    feeding = asyncio.create_task(feed_b())
    started = time.monotonic()
    info = await asyncio.to_thread(
        deploy_pipeline, member(a, host, t["a-in"], t["a-out"], t["dlq"], 5)
    )
    redeploy_s = time.monotonic() - started
    await feeding
    assert info["version"] == 2
    after = await host_call(host, "members")
    assert after[b]["stamp"] == stamps[b]["stamp"], "the other member was restarted"
    assert after[a]["stamp"] != stamps[a]["stamp"] and after[a]["error"] is None
    assert (await host_call(host, "stats"))["pid"] == pid, "the host process was replaced"
    want_b = {f"b{i}" for i in range(600)} | {f"b{i}" for i in range(1000, 2000)}
    out_b = await collect(
        kafka_bootstrap, t["b-out"], len(want_b - {"b7", "b507", "b1007", "b1507"})
    )
    counts = Counter(e.id for e in out_b)
    assert set(counts) == want_b - {"b7", "b507", "b1007", "b1507"}
    assert max(counts.values()) == 1
    await produce(kafka_bootstrap, t["a-in"], batch("a", 1010, 10))
    out_a = await collect(kafka_bootstrap, t["a-out"], 598 + 10)
    assert {e.data["m"] for e in out_a if e.data["n"] >= 1000} == {5 * i for i in range(1010, 1020)}

    # a member that cannot start (its function's module is missing) fails its own deploy;
    # the host and B run on
    broken = member(f"hc-{tag}", host, t["a-in"], t["a-out"], t["dlq"], 1)
    broken["spec"]["steps"][1]["function"] = "tests.integration.host_funcs:same"
    with pytest.raises(
        DeployError, match=r"did not start on host .*refuses to load in a Ray worker"
    ):
        await asyncio.to_thread(deploy_pipeline, broken)
    assert set(await host_call(host, "members")) == {a, b}
    assert (await host_call(host, "stats"))["pid"] == pid

    # a controller killed with SIGKILL finds the membership in Redis when it restarts: the host
    # runs on untouched, and the undeploys below are made from the stored membership
    victim = await asyncio.to_thread(controller_pid)
    os.kill(victim, signal.SIGKILL)
    await wait_for(lambda: controller_pid() != victim, 60, "the controller to restart")
    rows = {r["name"]: r for r in eventbus_client.list()}
    assert rows[a]["status"] == rows[b]["status"] == "RUNNING"
    assert await host_call(host, "members") == after
    assert (await host_call(host, "stats"))["pid"] == pid

    # undeploy A: B runs on in the same process; undeploy B: the host goes
    await asyncio.to_thread(eventbus_client.delete, a)
    assert set(await host_call(host, "members")) == {b}
    assert (await host_call(host, "stats"))["pid"] == pid
    await produce(kafka_bootstrap, t["b-in"], batch("b", 3010, 10))
    out_b = await collect(kafka_bootstrap, t["b-out"], len(counts) + 10)
    assert {f"b{i}" for i in range(3010, 3020)} <= {e.id for e in out_b}
    # B moves off the host into replicas of its own: the host, empty now, goes; B's group
    # goes on from its committed offsets
    alone = member(b, host, t["b-in"], t["b-out"], t["dlq"], 3)
    del alone["spec"]["serving"]["host"]
    await asyncio.to_thread(deploy_pipeline, alone)
    assert f"eventbus-host-{host}" not in apps() and f"eventbus-{b}" in apps()
    await produce(kafka_bootstrap, t["b-in"], batch("b", 3020, 10))
    out_b = await collect(kafka_bootstrap, t["b-out"], len(counts) + 20)
    assert {f"b{i}" for i in range(3010, 3030)} <= {e.id for e in out_b}
    assert max(Counter(e.id for e in out_b).values()) == 1
    await asyncio.to_thread(eventbus_client.delete, b)
    assert f"eventbus-{b}" not in apps()

    # hostile: what a shared process cannot hold is refused before anything runs
    bad_doc = member(f"hd-{tag}", host, t["a-in"], t["a-out"], t["dlq"], 1)
    bad_doc["spec"]["serving"]["runtime_env"] = {"pip": ["six"]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad_doc))
    started = time.monotonic()
    with pytest.raises(PipelineConfigError, match=r"serving\.runtime_env is .* but serving\.host"):
        eventbus_client.deploy(path)
    # refused by validation (the message above), not after trying to build the environment:
    # that takes minutes (and no application was started)
    assert time.monotonic() - started < 60
    assert f"eventbus-host-{host}" not in apps()
    print(f"redeploy of one member with the other fed: {redeploy_s:.1f} s")
