"""Live model experiments on the real stack (one tiny model, one pipeline, fed over Kafka).

A shadow version gets its share of the rows (chosen by event id) mirrored and compared with the
served outputs, which alone are delivered; the comparison's agreement is the one the two models'
definitions give. Then a version that raises on some inputs (an injected regression) takes all
traffic, is rolled back to the previous version automatically, and every event is delivered or
dead-lettered with its reason: none is missing.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import warnings
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from aiokafka import AIOKafkaConsumer

from eventbus import CloudEvent
from eventbus.errors import ModelError
from eventbus.eventing._codecs import decode_kafka
from tests.integration.kafka_helpers import collect, produce, reader_gaps

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

SHARE = 0.5


class _Ident(torch.nn.Module):
    """Version 1: the row itself (two numbers): its label is the larger's index."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


class _Flip(torch.nn.Module):
    """The shadow candidate: swaps the two outputs of rows whose first number is positive."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x[:, :1] > 0, x.flip(1), x)


class _Regressed(torch.nn.Module):
    """The injected regression: raises on a batch holding a row whose first number is > 5."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x[:, 0] > 5.0).any()):
            raise RuntimeError("injected regression")
        return x * 1.0


def _export(module: torch.nn.Module, path: Path) -> Path:
    ep = torch.export.export(
        module, (torch.randn(2, 2),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(ep, path)
    return path


def _mirrored(event_id: str) -> bool:
    """Whether the shadow takes this event's row (as the step and the replica draw it)."""
    u = zlib.crc32(f"/t\x00{event_id}".encode()) / 2**32
    return (u * 65536.0) % 1.0 < SHARE


def _events(prefix: str, first: Any) -> list[CloudEvent]:
    return [
        CloudEvent.create(type="req", source="/t", id=f"{prefix}{i}", data={"x": [first(i), 0.0]})
        for i in range(200)
    ]


async def _settled(
    bootstrap: str, topics: list[str], ids: set[str], timeout_s: float
) -> dict[str, dict[str, CloudEvent]]:
    """Read the topics until every id is in one of them (or the deadline)."""
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    gaps, seen = reader_gaps(), {t: {} for t in topics}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not ids <= set().union(*seen.values()):
            batch, _ = gaps.take(consumer, await consumer.getmany(timeout_ms=200), time.monotonic())
            for tp, records in batch.items():
                for r in records:
                    e = decode_kafka(
                        r.value,
                        list(r.headers or ()),
                        key=r.key,
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=r.offset,
                        default_type="x",
                        default_source="x",
                    )
                    seen[tp.topic][e.id] = e
    finally:
        await consumer.stop()
    return seen


async def _until(what: str, check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)  # polling the registry for a condition


async def test_shadow_comparison_and_rollback_on_injected_regression(
    deploy_pipeline: Any,
    eventbus_client: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    model, pipeline = f"lv-{uuid.uuid4().hex[:6]}", f"live-{uuid.uuid4().hex[:6]}"
    src, sink, dlq = topic_factory("live-in"), topic_factory("live-out"), topic_factory("live-dlq")
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": pipeline},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [
                    {
                        "id": "score",
                        "model": {
                            "name": model,
                            "path": str(_export(_Ident(), tmp_path / "v1.pt2")),
                            "input": "data.x",
                            "output": {"data.y": "output", "data.v": "version"},
                            "serving": {"max_batch_size": 8, "batch_wait_ms": 1},
                        },
                    }
                ],
                "sink": {"kafka": {"topic": sink}},
                "dead_letter": {"kafka": {"topic": dlq}},
                "delivery": {"retries": 4, "backoff": {"initial_ms": 200, "max_ms": 1000}},
                "serving": {"batch": {"max_size": 50, "linger_ms": 2}},
            },
        }
    )
    info = await asyncio.to_thread(
        eventbus_client.push_model, model, _export(_Flip(), tmp_path / "v2.pt2"), serve=False
    )
    assert info["version"] == 2 and info["status"] == "candidate" and info["serving"] == 1
    for version, share, match in (
        (1, SHARE, "already serves; shadow another version"),
        (9, SHARE, "has no version 9"),
        (2, 0.0, r"outside \(0, 1\]"),
        (2, float("nan"), r"outside \(0, 1\]"),
    ):
        with pytest.raises(ModelError, match=match):
            eventbus_client.shadow_model(model, version, share)
    # the command returns once the model's replica mirrors: every call from here on is offered
    assert eventbus_client.shadow_model(model, 2, SHARE)["mirroring"] is True

    # Shadow: 1 in 4 rows has a positive first number, where the candidate's label differs.
    phase1 = _events("s", lambda i: 1.0 if i % 4 == 0 else -1.0)
    await produce(kafka_bootstrap, src, phase1)
    out = await collect(kafka_bootstrap, sink, len(phase1), timeout_s=60)
    assert {e.data["v"] for e in out} == {1}, "a shadow output was delivered"
    picked = [e for e in phase1 if _mirrored(e.id)]
    expected = sum(e.data["x"][0] < 0 for e in picked) / len(picked)

    def compared() -> Any:
        [row] = [r for r in eventbus_client.list_models(model) if r["version"] == 2]
        c = row["shadow"]
        return c if c and c["rows"] + c["dropped_rows"] + c["error_rows"] >= len(picked) else None

    # the replica flushes its comparison every second, events or none
    c = await _until("the shadow comparison", compared, 30)
    print(f"shadow: {len(picked)} rows picked, expected agreement {expected:.4f}; got {c}")
    assert c["rows"] + c["dropped_rows"] == len(picked) and c["errors"] == 0 and c["active"]
    if c["dropped_rows"] == 0:  # nothing dropped: the comparison is exact
        assert c["agreement"] == pytest.approx(expected) and c["mad"] == pytest.approx(1 - expected)
    else:  # a loaded machine dropped some mirrored calls (counted): roughly the same
        assert abs(c["agreement"] - expected) < 0.2
    assert c["live_p99_ms"] is not None and c["candidate_p99_ms"] is not None

    def in_status() -> Any:  # the step reports the model's experiment as its replica told
        figures = eventbus_client.status(pipeline)["figures"]
        return figures.get("model_shadows", {}).get("score")

    # the step asks its model's replica for the experiment (every 5 s, at a batch) and
    # publishes its figures while events flow: a trickle of events the shadow does not take
    trickle = (f"t{k}" for k in range(10**6) if not _mirrored(f"t{k}"))

    deadline = time.monotonic() + 60
    while not (shown := await asyncio.to_thread(in_status)):
        assert time.monotonic() < deadline, "timed out waiting for the shadow in the status"
        one = CloudEvent.create(type="req", source="/t", id=next(trickle), data={"x": [-1.0, 0.0]})
        await produce(kafka_bootstrap, src, [one])
        await asyncio.sleep(0.2)  # polling the status for a condition, one event a look
    assert shown["model"] == model and shown["version"] == 2 and shown["share"] == SHARE
    assert eventbus_client.shadow_model(model, None)["mirroring"] is False
    [row] = [r for r in eventbus_client.list_models(model) if r["version"] == 2]
    assert row["shadow"]["active"] is False and row["status"] == "candidate"

    # Rollback: version 3 raises on rows with a first number > 5 (recent requests have none,
    # so it validates and takes all traffic); it regresses live and is rolled back to 1.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(_Regressed()), tmp_path / "v3.pt")
    info = await asyncio.to_thread(eventbus_client.push_model, model, tmp_path / "v3.pt")
    assert info["serving"] == 3
    phase2 = _events("r", lambda i: 9.0 if i % 10 == 0 else -1.0)
    await produce(kafka_bootstrap, src, phase2)
    seen = await _settled(kafka_bootstrap, [sink, dlq], {e.id for e in phase2}, 90)
    delivered = {i: e for i, e in seen[sink].items() if i.startswith("r")}
    dead = {i: e for i, e in seen[dlq].items() if i.startswith("r")}
    missing = {e.id for e in phase2} - set(delivered) - set(dead)
    assert not missing, f"events neither delivered nor dead-lettered: {sorted(missing)[:10]}"
    for e in dead.values():
        assert "injected regression" in e.attributes["eberror"], e.attributes["eberror"]
    assert any(e.data["v"] == 1 for e in delivered.values()), "no event served after the rollback"
    assert any(e.data["x"][0] == 9.0 for e in delivered.values()), (
        "every trigger row was dead-lettered: the rollback came after all retries"
    )
    listed = {r["version"]: r for r in eventbus_client.list_models(model)}
    assert listed[1]["status"] == "serving" and listed[1]["traffic"] == 1.0
    assert listed[3]["status"] == "rolled-back" and "error rate" in listed[3]["error"]
    [rollback] = [h for h in eventbus_client.model_history(model) if h["kind"] == "rollback"]
    print(f"rollback: {rollback}; delivered {len(delivered)}, dead-lettered {len(dead)}")
    assert rollback["version"] == 3 and rollback["to"] == 1 and rollback["from"] == "serving"
    assert rollback["figures"]["version"]["error_rows"] > 0 and rollback["at"] > 0
    assert rollback["figures"]["previous"]["error_rows"] == 0
