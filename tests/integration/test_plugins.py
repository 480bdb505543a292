"""A third-party plugin on the real stack: the example package under examples/plugin (installed
by `make setup` with its entry points) contributes the ``redact`` step and the ``jsonl`` sink;
a pipeline deployed to Ray Serve uses both, with a Kafka source on the Tansu broker."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from eventbus import CloudEvent
from tests.integration.kafka_helpers import produce, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

N = 2_000


async def test_plugin_step_and_sink_in_a_deployed_pipeline(
    deploy_pipeline: Any, kafka_bootstrap: str, topic_factory: Any, tmp_path: Path
) -> None:
    src = topic_factory("plugin-in", partitions=2)
    out = tmp_path / "cards.jsonl"
    info = deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": "plugin-cards"},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [
                    {"id": "big", "filter": "data.amount >= 10"},
                    {"id": "hide", "redact": {"fields": ["card"], "mask": "####"}},
                ],
                "sink": {"jsonl": {"path": str(out)}},
                "serving": {"replicas": 1, "batch": {"max_size": 500}},
            },
        }
    )
    assert info["steps"] == 2
    events = [
        CloudEvent.create(
            type="pay", source="/t", id=f"p{i}", data={"amount": i % 20, "card": f"4000-{i}"}
        )
        for i in range(N)
    ]
    await produce(kafka_bootstrap, src, events)
    expected = {f"p{i}" for i in range(N) if i % 20 >= 10}
    deadline = time.monotonic() + 60
    lines: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        if out.exists():
            lines = [json.loads(x) for x in out.read_bytes().splitlines()]
            if len(lines) >= len(expected):
                break
        await asyncio.sleep(0.1)
    assert {x["id"] for x in lines} == expected
    assert len(lines) == len(expected)  # once each
    assert all(x["data"]["card"] == "####" for x in lines)
    await wait_committed(kafka_bootstrap, "eventbus-plugin-cards", src)
