"""Each event's source partition reaches the steps that keep state per partition: the
replica's dispatch of undecoded records (``decoding_dispatch``) and the runner's ``origins``."""

from __future__ import annotations

import asyncio
from typing import Any

from eventbus.eventing._codecs import RawRecord, encode_kafka_binary
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner
from eventbus.serving._replica_sources import decoding_dispatch


def runner(time: str = "event") -> PipelineRunner:
    join = {
        "sides": [
            {"name": "order", "when": "type == 'o'", "key": "data.id"},
            {"name": "payment", "when": "type == 'p'", "key": "data.id"},
        ],
        "time": time,
    }
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "lanes"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [{"id": "f", "filter": "true"}, {"id": "paid", "join": join}],
            "sink": {"kafka": {"topic": "out"}},
        },
    }
    return PipelineRunner(PipelineConfig.model_validate(doc))


def record(kind: str, key: str, minute: int, partition: int, offset: int) -> RawRecord:
    e = CloudEvent.create(
        type=kind,
        source="/s",
        id=f"{kind}{key}",
        data={"id": key},
        time=f"2024-05-01T12:{minute:02d}:00Z",
    )
    headers, value = encode_kafka_binary(e)
    return RawRecord(value, headers, None, "orders", partition, offset)


def lanes(r: PipelineRunner) -> dict[str, int]:
    wm = r.steps[1].pairs.watermark  # type: ignore[attr-defined]
    return {lane: t for lane, (t, _) in wm.lanes.items()}


def test_decoding_dispatch_hands_each_records_partition_to_the_join() -> None:
    r = runner()
    assert r.uses_origins
    src = r.config.consumed_sources[0]
    dispatch: Any = decoding_dispatch(src, r.run, blocking=False)
    bad = RawRecord(b"{not json", [("content-type", b"application/json")], None, "orders", 1, 9)
    records = [record("o", "a", 10, 0, 0), bad, record("p", "a", 2, 1, 1)]
    outcomes = asyncio.run(dispatch(records))
    assert isinstance(outcomes[1], Failure) and outcomes[1].step == "decode"
    assert outcomes[0] == []
    [joined] = outcomes[2]  # type: ignore[misc]
    assert joined.data == {"order": {"id": "a"}, "payment": {"id": "a"}}
    ms = 1714564800000  # 2024-05-01T12:00:00Z
    assert lanes(r) == {"orders[0]": ms + 10 * 60_000, "orders[1]": ms + 2 * 60_000}


def test_without_origins_every_event_is_one_lane_and_processing_time_needs_none() -> None:
    r = runner()
    events = [
        CloudEvent.create(
            type="o", source="/s", id="o1", data={"id": "a"}, time="2024-05-01T12:00:00Z"
        )
    ]
    assert r.run(events) == [[]]
    assert list(lanes(r)) == ["-"]
    assert not runner("processing").uses_origins
