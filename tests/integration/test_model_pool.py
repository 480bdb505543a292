"""Model pools on the real stack: one multiplexed Serve application holding at most 2 models
per replica serves 3 models picked per event by CEL, fed over Kafka.

Every event reaches the model its ``select`` names (each model answers its own constant), the
models are evicted and loaded again as they alternate, and no event is lost; events whose
``select`` fails or names no registered model are dead-lettered with the reason, their
batch-mates delivered; the pool's loads and evictions show in the pipeline's status.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import CloudEvent
from tests.integration.kafka_helpers import collect, produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

REGIONS = {"eu": 10.0, "us": 20.0, "ap": 30.0}


def _constant(value: float, path: Path) -> Path:
    """A model answering ``value`` for any row of one number."""
    module = torch.nn.Linear(1, 1).eval()
    with torch.no_grad():
        module.weight.zero_()
        module.bias.fill_(value)
    ep = torch.export.export(
        module, (torch.zeros(2, 1),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(ep, path)
    return path


async def test_pool_routes_by_cel_evicts_and_reloads_without_losing_events(
    deploy_pipeline: Any,
    eventbus_client: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    prefix = f"pm{uuid.uuid4().hex[:6]}"
    pool = f"p{uuid.uuid4().hex[:6]}"
    for region, value in REGIONS.items():
        path = _constant(value, tmp_path / f"{region}.pt2")
        await asyncio.to_thread(eventbus_client.push_model, f"{prefix}-{region}", path)
    src, sink, dlq = topic_factory("pool-in"), topic_factory("pool-out"), topic_factory("pool-dlq")
    name = f"mpool-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "model_pools": {pool: {"max_models_per_replica": 2}},
                "steps": [
                    {
                        "id": "score",
                        "model": {
                            "pool": pool,
                            "select": f"'{prefix}-' + data.region",
                            "input": "[1.0]",
                            "output": {"data.y": "output", "data.v": "version"},
                        },
                    },
                    {  # a static name on the same pool
                        "id": "base",
                        "model": {
                            "pool": pool,
                            "name": f"{prefix}-eu",
                            "input": "[1.0]",
                            "output": "data.base",
                        },
                    },
                ],
                "sink": {"kafka": {"topic": sink}},
                "dead_letter": {"kafka": {"topic": dlq}},
                "delivery": {"retries": 0},
                "serving": {"batch": {"max_size": 30, "linger_ms": 5}},
            },
        }
    )
    regions = list(REGIONS)
    events = [
        CloudEvent.create(type="req", source="/t", id=f"e{i}", data={"region": regions[i % 3]})
        for i in range(240)
    ]
    hostile = [
        CloudEvent.create(type="req", source="/t", id="nomodel", data={"region": "mars"}),
        CloudEvent.create(type="req", source="/t", id="noregion", data={"other": 1}),
        CloudEvent.create(type="req", source="/t", id="notname", data={"region": "EU!"}),
    ]
    for k in range(0, len(events), 40):  # several batches, the models alternating in each
        await produce(kafka_bootstrap, src, events[k : k + 40] + hostile[k // 40 : k // 40 + 1])
    out = await collect(kafka_bootstrap, sink, len(events), timeout_s=120)
    assert len(out) == len(events) == len({e.id for e in out}), "an event was lost or duplicated"
    for e in out:
        region = regions[int(e.id[1:]) % 3]
        assert e.data["y"] == REGIONS[region] and e.data["v"] == 1, (e.id, e.data)
        assert e.data["base"] == REGIONS["eu"]
    dead = {e.id: e for e in await collect(kafka_bootstrap, dlq, 3, timeout_s=60)}
    assert set(dead) == {"nomodel", "noregion", "notname"}
    assert all(d.attributes["ebstep"] == "score" for d in dead.values())
    assert (
        f"no model named '{prefix}-mars' in the registry" in dead["nomodel"].attributes["eberror"]
    )
    assert (
        f"select of pool '{pool}' failed on event 'noregion'"
        in dead["noregion"].attributes["eberror"]
    )
    assert "not a model name" in dead["notname"].attributes["eberror"]

    # The pool's figures reach the status: 3 models through 2 slots, so evictions and reloads.
    deadline = time.monotonic() + 60
    figures: dict[str, Any] = {}
    while time.monotonic() < deadline:
        figures = eventbus_client.status(name)["figures"].get("model_pools", {}).get("score", {})
        if figures.get("loads", 0) >= 4 and figures.get("evictions", 0) >= 2:
            break
        await asyncio.sleep(0.5)  # polling the replicas' published figures, with a deadline
    assert figures["pool"] == pool, figures
    assert figures["loads"] >= 4 and figures["evictions"] >= 2, figures
    assert figures["models"] <= 2 and figures["failed_loads"] >= 1, figures

    # Deleting the only pipeline that names the pool deletes the pool's Serve application.
    from ray import serve

    from eventbus.models._pool import pool_app_name

    eventbus_client.delete(name)
    deadline = time.monotonic() + 60
    while pool_app_name(pool) in serve.status().applications:
        assert time.monotonic() < deadline, f"{pool_app_name(pool)} still on Serve"
        await asyncio.sleep(0.5)  # polling Serve's applications, with a deadline
