"""Joins on event time (``time: event``): the watermark per source partition, allowed
lateness, windows closed by the watermark, idle partitions; on the in-memory state and on the
Redis scripts of every emit mode and of mode latest (the session's real Redis)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from eventbus.errors import PipelineConfigError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner

SIDES = [
    {"name": "order", "when": "type == 'order.created'", "key": "data.order_id"},
    {"name": "payment", "when": "type == 'payment.created'", "key": "data.order_id"},
]
MIN = 60_000


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest) -> str | None:
    """None (in-memory state) or the session Redis's URL."""
    return None if request.param == "memory" else request.getfixturevalue("redis_url")


class Clock:
    """The join step's wall clock, moved by the test."""

    def __init__(self) -> None:
        self.ms = 1_714_564_800_000  # 2024-05-01T12:00:00Z, the events' hour

    def __call__(self) -> int:
        return self.ms


def make(store: str | None, clock: Clock, **join: Any) -> PipelineRunner:
    spec = {"sides": SIDES, "time": "event", "window_s": 60, **join}
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": f"t{uuid.uuid4().hex[:10]}"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [{"id": "paid", "join": spec}],
            "sink": {"kafka": {"topic": "out"}},
        },
    }
    r = PipelineRunner(PipelineConfig.model_validate(doc), redis_url=store)
    r.steps[0].now = clock  # type: ignore[method-assign]
    return r


def ev(kind: str, n: int, minute: float, key: str = "k1") -> CloudEvent:
    """An order ('o') or payment ('p') of ``key`` at 12:00 + ``minute`` (event time)."""
    t = "order.created" if kind == "o" else "payment.created"
    ms = round(minute * MIN)
    time = f"2024-05-01T12:{ms // MIN:02d}:{ms % MIN / 1000:06.3f}Z"
    return CloudEvent.create(
        type=t, source="/s", id=f"{kind}{n}", data={"order_id": key, "n": n}, time=time
    )


def late(out: Any) -> bool:
    return isinstance(out, Failure) and out.error_type == "LateEventError"


def absorbed(r: PipelineRunner) -> dict[str, int]:
    return {k: v for k, v in r.stats()["paid"].items() if k.startswith("absorbed_") and v}


@pytest.mark.parametrize("emit", ["every", "first"])
def test_a_slow_partition_holds_the_watermark_back(store: str | None, emit: str) -> None:
    clock = Clock()
    r = make(store, clock, emit=emit)
    assert r.run([ev("o", 1, 0, key="a"), ev("o", 2, 0, key="b")], origins=["o[0]", "o[1]"]) == [
        [],
        [],
    ]
    # partition 0 runs 10 minutes ahead of partition 1
    assert r.run([ev("o", 3, 10, key="c")], origins=["o[0]"]) == [[]]
    # the watermark is partition 1's 12:00: its payment of 12:00:30 is not late, and joins
    [out] = r.run([ev("p", 4, 0.5, key="b")], origins=["o[1]"])
    assert [e.data["order"]["n"] for e in out] == [2]  # type: ignore[union-attr]
    # one watermark for both (no origins): 12:10 makes 12:00:30 late
    r2 = make(store, clock, emit=emit)
    r2.run([ev("o", 1, 0, key="a"), ev("o", 2, 0, key="b")])
    r2.run([ev("o", 3, 10, key="c")])
    assert late(r2.run([ev("p", 4, 0.5, key="b")])[0])
    assert absorbed(r2)["absorbed_late"] == 1


@pytest.mark.parametrize("emit", ["every", "first"])
def test_allowed_lateness_and_the_dead_letter_reason(store: str | None, emit: str) -> None:
    clock = Clock()
    r = make(store, clock, emit=emit, allowed_lateness_s=30)
    r.run([ev("o", 1, 10)], origins=["t[0]"])  # watermark 12:10
    # 12:08:31 + 60 s + 30 s is after 12:10: on time; 12:08:29 is 1 s too late
    [ok, bad] = r.run([ev("o", 2, 8 + 31 / 60, key="k2"), ev("o", 3, 8 + 29 / 60, key="k3")])
    assert ok == [] and late(bad)
    message = bad.message  # type: ignore[union-attr]
    assert "join key 'k3': event time 2024-05-01T12:08:29" in message
    assert re.search(r"91\.0 s behind the watermark 2024-05-01T12:10:00", message)
    assert "raise allowed_lateness_s" in message
    assert absorbed(r)["absorbed_late"] == 1


def test_an_event_stored_before_is_not_late_when_consumed_again(store: str | None) -> None:
    clock = Clock()
    r = make(store, clock)
    first = r.run([ev("o", 1, 0), ev("p", 1, 0.5)], origins=["t[0]", "t[1]"])
    r.run([ev("o", 9, 30, key="z")], origins=["t[0]"])
    r.run([ev("o", 8, 30, key="z")], origins=["t[1]"])  # watermark 12:30 on both
    again = r.run([ev("o", 1, 0), ev("p", 1, 0.5)], origins=["t[0]", "t[1]"])
    assert again == first and [e.id for e in again[1]] == [e.id for e in first[1]]  # type: ignore[union-attr]
    assert late(r.run([ev("p", 2, 0.5)], origins=["t[1]"])[0])  # new: late


@pytest.mark.parametrize("emit", ["every", "first"])
def test_windows_close_when_the_watermark_passes(store: str | None, emit: str) -> None:
    clock = Clock()
    r = make(store, clock, emit=emit, mode="outer", allowed_lateness_s=30)
    [sweeper] = r.timers()
    r.run([ev("o", 1, 0)], origins=["t[0]"])  # window [12:00, 12:01), closes at 12:01:30
    r.run([ev("o", 2, 1 + 29 / 60, key="x")], origins=["t[0]"])
    assert sweeper.sweep()[0] == []  # watermark 12:01:29: still open
    clock.ms += 20_000  # wall-clock time means nothing while the partition is active
    r.run([ev("o", 3, 1.5, key="y")], origins=["t[0]"])
    outputs, dead, claimed = sweeper.sweep()
    assert [e.data["order"]["n"] for e in outputs] == [1] and dead == []
    assert outputs[0].data["_missing"] == ["payment"]
    sweeper.forget(claimed)


def test_idle_partitions_stop_holding_the_watermark_back(store: str | None) -> None:
    clock = Clock()
    r = make(store, clock, mode="outer", watermark_idle_s=5)
    [sweeper] = r.timers()
    r.run([ev("o", 1, 0)], origins=["t[0]"])
    r.run([ev("o", 2, 0, key="k2")], origins=["t[1]"])
    clock.ms += 4_000
    r.run([ev("o", 3, 5, key="k3")], origins=["t[0]"])
    assert sweeper.sweep()[0] == []  # t[1] (12:00) holds the watermark back
    clock.ms += 2_000  # t[1] idle 6 s: the watermark is t[0]'s 12:05
    outputs, _, claimed = sweeper.sweep()
    assert sorted(e.data["order"]["n"] for e in outputs) == [1, 2]
    sweeper.forget(claimed)
    # every partition idle: the watermark moves on with the wall clock, the last window closes
    clock.ms += 61_000
    outputs, _, claimed = sweeper.sweep()
    assert [e.data["order"]["n"] for e in outputs] == [3]
    sweeper.forget(claimed)
    assert r.stats()["paid"]["pending_keys"] == 0


def test_every_pair_by_event_time_in_shuffled_batches(store: str | None) -> None:
    """Out-of-order events within the lateness: the same pairs as in order."""
    clock = Clock()
    evs = [ev("o", i, i / 10, key=f"k{i % 3}") for i in range(12)]
    evs += [ev("p", 100 + i, i / 10 + 0.05, key=f"k{i % 3}") for i in range(12)]
    expected = {(o, p) for o in range(12) for p in range(100, 112) if o % 3 == (p - 100) % 3}
    import random

    random.Random(3).shuffle(evs)
    r = make(store, clock, window_s=600, allowed_lateness_s=120)
    got: set[tuple[int, int]] = set()
    for b in range(0, 24, 5):
        lanes = [f"t[{i % 2}]" for i in range(len(evs[b : b + 5]))]
        for out in r.run(evs[b : b + 5], origins=lanes):
            assert not isinstance(out, Failure)
            got |= {(e.data["order"]["n"], e.data["payment"]["n"]) for e in out}  # type: ignore[union-attr]
    assert got == expected


def test_latest_mode_on_event_time(store: str | None) -> None:
    clock = Clock()
    r = make(store, clock, mode="latest", table="order")
    assert r.run([ev("o", 1, 10)], origins=["t[0]"]) == [[]]
    [[joined]] = r.run([ev("p", 2, 9.5)], origins=["t[0]"])  # type: ignore[misc]
    assert joined.data == {
        "order": {"order_id": "k1", "n": 1},
        "payment": {"order_id": "k1", "n": 2},
    }
    assert late(r.run([ev("p", 3, 8)], origins=["t[0]"])[0])
    assert absorbed(r) == {"absorbed_late": 1}


def test_an_event_without_time_fails_with_the_fix(store: str | None) -> None:
    r = make(store, Clock())
    no_time = CloudEvent.create(type="order.created", source="/s", id="o1", data={"order_id": "k"})
    [f] = r.run([no_time])
    assert isinstance(f, Failure) and f.error_type == "ValueError"
    assert "has no 'time' attribute; a join with time: event windows by it" in f.message


@pytest.mark.parametrize("field", ["allowed_lateness_s", "watermark_idle_s"])
def test_event_time_fields_need_time_event(field: str) -> None:
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "x"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [{"id": "paid", "join": {"sides": SIDES, field: 5}}],
            "sink": {"kafka": {"topic": "out"}},
        },
    }
    with pytest.raises((PipelineConfigError, ValueError), match=f"'{field}' is for 'time: event'"):
        PipelineConfig.model_validate(doc)


def test_an_event_far_ahead_of_the_wall_clock_cannot_poison_the_watermark(
    store: str | None,
) -> None:
    clock = Clock()
    clock.ms = 1_700_000_000_000  # 2023-11-14T22:13:20Z
    r = make(store, clock, max_ahead_s=600)
    [f] = r.run([ev("o", 1, 0)])  # 2024-05-01: months ahead of this wall clock
    assert isinstance(f, Failure) and f.error_type == "EventTimeAheadError"
    assert "ahead of the wall clock (2023-11-14T22:13:20Z), beyond max_ahead_s (600 s)" in f.message
    assert absorbed(r) == {"absorbed_ahead": 1}
    clock.ms = 1_714_564_800_000  # 2024-05-01T12:00:00Z: the same events are fine now
    assert r.run([ev("o", 1, 0), ev("p", 1, 0.5)])[1][0].data["payment"]["n"] == 1  # type: ignore[index,union-attr]


@pytest.mark.parametrize(
    ("time", "message"),
    [
        ("yesterday", "time 'yesterday' is not an RFC 3339 timestamp"),
        ("2024-05-01T12:00:00", "has no UTC offset"),
        (1714564800, "has time 1714564800 (int); it must be an RFC 3339 string"),
    ],
)
def test_a_malformed_time_fails_only_its_event(store: str | None, time: Any, message: str) -> None:
    clock = Clock()
    r = make(store, clock)
    bad = ev("o", 2, 0)
    bad.attributes["time"] = time
    out = r.run([ev("o", 1, 0), bad, ev("p", 1, 0)])
    assert out[0] == [] and len(out[2]) == 1  # type: ignore[arg-type]
    assert isinstance(out[1], Failure) and message in out[1].message


def test_many_lanes_and_a_large_batch_stay_fast(store: str | None) -> None:
    """5,000 events over 200 partitions in one batch: one script call, every pair."""
    clock = Clock()
    r = make(store, clock, window_s=3600)
    evs = [ev("o" if i % 2 == 0 else "p", i, (i % 600) / 60, key=f"k{i // 2}") for i in range(5000)]
    lanes_of = [f"t[{i % 200}]" for i in range(5000)]
    import time as wall

    started = wall.perf_counter()
    out = r.run(evs, origins=lanes_of)
    assert wall.perf_counter() - started < 10
    assert sum(len(o) for o in out) == 2500  # type: ignore[arg-type]
