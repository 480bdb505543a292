"""A model application scaling to zero and back on the real stack: a tiny model with
``serving.idle_s: 2`` behind a Kafka-fed pipeline. With no call its Serve application is
deleted (Serve holds none); events then arrive, the step's call wakes the model and waits for
it, and every event is delivered with the model's output (none lost)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import CloudEvent
from eventbus.models._serve import model_app_name
from tests.integration.kafka_helpers import collect, produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]


def _double(path: Path) -> Path:
    """A model answering twice its one input."""
    module = torch.nn.Linear(1, 1, bias=False).eval()
    with torch.no_grad():
        module.weight.fill_(2.0)
    ep = torch.export.export(
        module, (torch.zeros(2, 1),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(ep, path)
    return path


async def _until(what: str, check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)  # polling Serve and the registry for a condition


async def test_model_application_scales_to_zero_and_a_call_wakes_it(
    deploy_pipeline: Any,
    eventbus_client: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    from ray import serve

    model, name = f"mz-{uuid.uuid4().hex[:6]}", f"mzero-{uuid.uuid4().hex[:6]}"
    src, sink, dlq = topic_factory("mz-in"), topic_factory("mz-out"), topic_factory("mz-dlq")
    deploy_pipeline(
        {
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
                            "path": str(_double(tmp_path / "double.pt2")),
                            "input": "[data.x]",
                            "output": "data.y",
                            # the wake is a cold start on a loaded machine: the call waits
                            "timeout_s": 120,
                            "serving": {"idle_s": 2},
                        },
                    }
                ],
                "sink": {"kafka": {"topic": sink}},
                "dead_letter": {"kafka": {"topic": dlq}},
            },
        }
    )
    # (not asserted running here: on a loaded machine the pipeline's own application can take
    # longer than idle_s to start after the model's, which then already went to zero)
    app = model_app_name(model)

    def scale() -> dict[str, Any]:
        [row] = [r for r in eventbus_client.list_models(model) if r["scale"]]
        return dict(row["scale"])

    def at_zero() -> bool:
        return scale()["at_zero"] is not None and app not in serve.status().applications

    await _until("the model application at zero", at_zero, 40)
    assert scale()["scale_downs"] == 1 and scale()["wakes"] == 0

    # events arriving at zero and during the wake: each waits, none is lost or dead-lettered
    events = [
        CloudEvent.create(type="req", source="/t", id=f"mz-{i}", data={"x": float(i)})
        for i in range(20)
    ]
    await produce(kafka_bootstrap, src, events[:1])
    await produce(kafka_bootstrap, src, events[1:])
    out = await collect(kafka_bootstrap, sink, len(events), timeout_s=150)
    assert {e.id: e.data["y"] for e in out} == {e.id: 2 * e.data["x"] for e in events}
    woke = scale()
    print(f"model at zero and back: {woke}")
    assert woke["wakes"] == 1 and woke["wake_failures"] == 0 and woke["cold_start_s"] > 0
    # it was back: the output came from its replica (and it goes to zero again when idle)
    assert woke["at_zero"] is None or woke["scale_downs"] == 2
