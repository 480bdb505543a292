"""The spine end to end on the real stack: Tansu, Redis, Ray Serve.

10,000 events through a deployed filter + convert + function pipeline; redeploy; delete; bad
YAML never deployed.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray

from eventbus import CloudEvent
from eventbus.errors import PipelineConfigError, PipelineNotFoundError
from tests.integration.kafka_helpers import collect, produce, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

N = 10_000


def doc(
    name: str, src: str, sink: str, dlq: str, factor: str = "2", placement: str = "replica"
) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": src}}],
            "steps": [
                {"id": "keep_even_ish", "filter": "type == 'n.created' && data.n % 3 != 0"},
                {
                    "id": "scale",
                    "convert": {"set": {"data.m": f"data.n * {factor}", "type": "'n.scaled'"}},
                },
                {"id": "score", "function": "tests.integration.funcs:score"},
            ],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "serving": {
                "replicas": 1,
                "batch": {"max_size": 1000, "linger_ms": 5},
                "source_placement": placement,
            },
        },
    }


def events(start: int, n: int) -> list[CloudEvent]:
    return [
        CloudEvent.create(type="n.created", source="/test", id=f"n{i}", data={"n": i})
        for i in range(start, start + n)
    ]


def expected_ids(start: int, n: int) -> tuple[set[str], set[str]]:
    kept = [i for i in range(start, start + n) if i % 3 != 0]
    return {f"n{i}" for i in kept if i % 500 != 7}, {f"n{i}" for i in kept if i % 500 == 7}


def wait_for_stats(client: Any, name: str, consumed: int, timeout_s: float = 30) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        stats: dict[str, int] = client.status(name)["sources"][0]
        if (
            stats.get("consumed") == consumed and stats.get("in_flight", 0) == 0
        ) or time.monotonic() > deadline:
            return stats


@pytest.mark.parametrize("placement", ["replica", "actor"])
async def test_ten_thousand_events_deploy_redeploy_delete(
    placement: str,
    deploy_pipeline: Any,
    eventbus_client: Any,
    kafka_bootstrap: str,
    topic_factory: Any,
) -> None:
    src, sink, dlq = (
        topic_factory("in", partitions=3),
        topic_factory("out", partitions=3),
        topic_factory("dlq"),
    )
    info = deploy_pipeline(doc("spine", src, sink, dlq, placement=placement))
    assert info == {"name": "spine", "version": 1, "sources": 1, "steps": 3}

    await produce(kafka_bootstrap, src, events(0, N), key_of=lambda e: str(e.data["n"] % 17))
    ok_ids, bad_ids = expected_ids(0, N)
    outs = await collect(kafka_bootstrap, sink, len(ok_ids))
    ids = Counter(e.id for e in outs)
    assert set(ids) == ok_ids, (
        f"missing {len(ok_ids - set(ids))}, unexpected {len(set(ids) - ok_ids)}"
    )
    assert max(ids.values()) == 1
    for e in outs:
        n = e.data["n"]
        assert e.type == "n.scaled" and e.data == {"n": n, "m": n * 2, "score": n % 10}
        assert e.source == "/test" and e.get("partitionkey") == str(n % 17)

    dead = await collect(kafka_bootstrap, dlq, len(bad_ids))
    assert {e.id for e in dead} == bad_ids
    for e in dead:
        assert e.type == "n.created"  # the original event, as it came in
        assert e["ebpipeline"] == "spine" and e["ebstep"] == "score"
        assert e["eberrortype"] == "ValueError" and e["eberror"] == f"cannot score n={e.data['n']}"
        assert e["ebtopic"] == src

    await wait_committed(kafka_bootstrap, "eventbus-spine", src)
    stats = wait_for_stats(eventbus_client, "spine", N)
    assert (
        stats["consumed"] == N
        and stats["outputs"] == len(ok_ids)
        and stats["failed"] == len(bad_ids)
    )

    # Redeploy a new version: new events take the new convert; nothing is processed twice.
    info = deploy_pipeline(doc("spine", src, sink, dlq, factor="10", placement=placement))
    assert info["version"] == 2
    assert [p["version"] for p in eventbus_client.list() if p["name"] == "spine"] == [2]
    await produce(kafka_bootstrap, src, events(N, 1000))
    ok2, bad2 = expected_ids(N, 1000)
    outs = await collect(kafka_bootstrap, sink, len(ok_ids) + len(ok2))
    new = [e for e in outs if e.id in ok2]
    assert {e.id for e in new} == ok2 and len(new) == len(ok2)
    assert all(e.data["m"] == e.data["n"] * 10 for e in new)
    assert len(outs) == len(ok_ids) + len(ok2)
    await wait_committed(kafka_bootstrap, "eventbus-spine", src)

    # Delete: the app, the source actor and the record are gone.
    eventbus_client.delete("spine")
    assert all(p["name"] != "spine" for p in eventbus_client.list())
    with pytest.raises(ValueError):
        ray.get_actor("eventbus-source-spine-0", namespace="eventbus")
    from ray import serve

    assert "eventbus-spine" not in serve.status().applications
    with pytest.raises(PipelineNotFoundError, match="no pipeline named 'spine' is deployed"):
        eventbus_client.delete("spine")


def test_bad_yaml_is_never_deployed(eventbus_client: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: eventbus/v1\nkind: Pipeline\nmetadata: {name: never}\nspec:\n"
        "  sources: [{kafka: {topic: a}}]\n  steps:\n    - id: x\n      filter: 'dta.a > 1'\n  sink: {kafka: {topic: b}}\n"
    )
    with pytest.raises(PipelineConfigError) as info:
        eventbus_client.deploy(bad)
    assert "unknown variable 'dta' (did you mean 'data'?)" in str(info.value)
    assert all(p["name"] != "never" for p in eventbus_client.list())
