"""The model step on the real stack: each model its own Serve deployment, fed over Kafka.

Outputs equal direct torch calls; a new version pushed under load is swapped in without losing
an event; a broken version is rejected and the old one keeps serving; an A/B split sends each
version its share.
"""

from __future__ import annotations

import asyncio
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import CloudEvent
from tests.integration.kafka_helpers import collect, produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]


def _module(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).eval()


class _Broken(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1] * float("nan")


def _export(module: torch.nn.Module, path: Path) -> Path:
    ep = torch.export.export(
        module, (torch.randn(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(ep, path)
    return path


def _script(module: torch.nn.Module, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), path)
    return path


def _pipeline(name: str, model: str, path: Path, src: str, sink: str, dlq: str) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": src}}],
            "steps": [
                {
                    "id": "score",
                    "model": {
                        "name": model,
                        "path": str(path),
                        "input": "data.x",
                        "output": {"data.y": "output", "data.v": "version"},
                        "serving": {"max_batch_size": 8, "batch_wait_ms": 1},
                    },
                }
            ],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "serving": {"batch": {"max_size": 200, "linger_ms": 2}},
        },
    }


def _events(prefix: str, rows: torch.Tensor) -> list[CloudEvent]:
    return [
        CloudEvent.create(type="req", source="/t", id=f"{prefix}{i}", data={"x": r})
        for i, r in enumerate(rows.tolist())
    ]


def _direct(module: torch.nn.Module, rows: torch.Tensor) -> list[float]:
    with torch.no_grad():
        return module(rows).reshape(-1).tolist()  # type: ignore[no-any-return]


async def test_outputs_equal_direct_torch_and_bad_input_is_dead_lettered(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    from eventbus.models import ModelRegistry

    model = f"m-{uuid.uuid4().hex[:6]}"
    src, sink, dlq = (
        topic_factory("model-in", partitions=2),
        topic_factory("model-out"),
        topic_factory("model-dlq"),
    )
    m1 = _module(1)
    deploy_pipeline(
        _pipeline(
            f"mp-{uuid.uuid4().hex[:6]}", model, _export(m1, tmp_path / "m1.pt2"), src, sink, dlq
        )
    )
    reg = ModelRegistry(redis_url)
    assert reg.state(model)["serving"] == 1 and reg.record(model, 1)["format"] == "export"
    rows = torch.randn(600, 4)
    bad = CloudEvent.create(type="req", source="/t", id="bad", data={"x": [1, 2, 3]})
    await produce(kafka_bootstrap, src, [*_events("e", rows), bad])
    out = await collect(kafka_bootstrap, sink, 600, timeout_s=90)
    by_id = {e.id: e.data for e in out}
    assert len(out) == 600 and len(by_id) == 600
    expect = _direct(m1, rows)
    for i, y in enumerate(expect):
        assert abs(by_id[f"e{i}"]["y"] - y) < 1e-5 and by_id[f"e{i}"]["v"] == 1
    [dead] = await collect(kafka_bootstrap, dlq, 1, timeout_s=30)
    assert dead.id == "bad" and dead.attributes["ebstep"] == "score"
    assert f"has shape (3,); model '{model}' takes rows of shape (4,)" in dead.attributes["eberror"]


async def test_hot_swap_under_load_rejects_broken_version_and_splits(
    deploy_pipeline: Any,
    eventbus_client: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    from eventbus.errors import ModelError, ModelValidationError

    model = f"m-{uuid.uuid4().hex[:6]}"
    src, sink, dlq = (
        topic_factory("swap-in", partitions=2),
        topic_factory("swap-out"),
        topic_factory("swap-dlq"),
    )
    m1, m2 = _module(1), _module(2)
    deploy_pipeline(
        _pipeline(
            f"sw-{uuid.uuid4().hex[:6]}", model, _export(m1, tmp_path / "m1.pt2"), src, sink, dlq
        )
    )
    rows = torch.randn(20_000, 4)
    events = _events("e", rows)
    pushed = asyncio.Event()
    sent = 0

    async def load() -> None:  # chunks of 50 events, paced, until 10 chunks after the push
        nonlocal sent
        after = 0
        while sent < len(events) and after < 10:
            await produce(kafka_bootstrap, src, events[sent : sent + 50])
            sent += 50
            after += pushed.is_set()
            await asyncio.sleep(0.01)  # pacing of the load, not a wait for a condition

    producer = asyncio.create_task(load())
    await collect(kafka_bootstrap, sink, 300, timeout_s=60)  # traffic flows (and is recorded) on v1
    info = await asyncio.to_thread(
        eventbus_client.push_model, model, _script(m2, tmp_path / "m2.pt")
    )
    pushed.set()
    assert info["version"] == 2 and info["serving"] == 2
    await producer
    assert sent < len(events), "the load ended before the push did"
    events = events[:sent]
    out = await collect(kafka_bootstrap, sink, len(events), timeout_s=90)
    assert len({e.id for e in out}) == len(events) == len(out), (
        "an event was lost or duplicated across the swap"
    )
    direct = {1: _direct(m1, rows), 2: _direct(m2, rows)}
    versions = [0, 0, 0]
    for e in out:
        i, v = int(e.id[1:]), e.data["v"]
        versions[v] += 1
        assert abs(e.data["y"] - direct[v][i]) < 1e-5
    assert versions[1] > 0 and versions[2] > 0

    # A broken version is rejected on the recorded requests; version 2 keeps serving.
    with pytest.raises(ModelValidationError, match="give non-finite outputs"):
        await asyncio.to_thread(
            eventbus_client.push_model, model, _export(_Broken(), tmp_path / "broken.pt2")
        )
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(ModelError, match="is not a torch artifact"):
        await asyncio.to_thread(eventbus_client.push_model, model, tmp_path / "junk.pt")
    listed = {r["version"]: r for r in eventbus_client.list_models(model)}
    assert listed[3]["status"] == "rejected" and "non-finite" in listed[3]["error"]
    assert listed[2]["status"] == "serving" and listed[1]["status"] == "retired" and 4 not in listed

    # A/B: half of the events (by id) to version 1, the rest to version 2.
    eventbus_client.split_model(model, 1, 0.5)
    sink2 = topic_factory("swap-out2")
    rows2 = torch.randn(400, 4)
    name2 = f"ab-{uuid.uuid4().hex[:6]}"
    src2 = topic_factory("swap-in2")
    deploy_pipeline(
        _pipeline(name2, model, tmp_path / "m1.pt2", src2, sink2, dlq)
    )  # another pipeline, the same model app
    await produce(kafka_bootstrap, src2, _events("a", rows2))
    out2 = await collect(kafka_bootstrap, sink2, 400, timeout_s=60)
    direct2 = {1: _direct(m1, rows2), 2: _direct(m2, rows2)}
    share = sum(e.data["v"] == 1 for e in out2) / len(out2)
    assert 0.35 < share < 0.65, share
    for e in out2:
        assert abs(e.data["y"] - direct2[e.data["v"]][int(e.id[1:])]) < 1e-5
    traffic = {r["version"]: r["traffic"] for r in eventbus_client.list_models(model)}
    assert traffic[1] == 0.5 and traffic[2] == 0.5
