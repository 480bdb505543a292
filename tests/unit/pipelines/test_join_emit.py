"""Join semantics by ``emit`` (every, first, latest), on the in-memory state and on the Redis
scripts (the session's real Redis): every pair of a key's window, counts per reason for each
event that emits nothing, dead letters for late, evicted and over-``max_key_bytes`` events."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from typing import Any

import pytest

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner
from eventbus.testing import run_pipeline

SIDES = [
    {"name": "order", "when": "type == 'order.created'", "key": "data.order_id"},
    {"name": "payment", "when": "type == 'payment.created'", "key": "data.order_id"},
]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest) -> str | None:
    """None (in-memory state) or the session Redis's URL."""
    return None if request.param == "memory" else request.getfixturevalue("redis_url")


def make(store: str | None, sides: list[dict[str, str]] = SIDES, **join: Any) -> PipelineRunner:
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": f"j{uuid.uuid4().hex[:10]}"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [{"id": "paid", "join": {"sides": sides, **join}}],
            "sink": {"kafka": {"topic": "out"}},
        },
    }
    return PipelineRunner(PipelineConfig.model_validate(doc), redis_url=store)


def ev(kind: str, i: str, key: str = "k1", **kw: Any) -> CloudEvent:
    t = "order.created" if kind == "o" else "payment.created"
    return CloudEvent.create(
        type=t, source="/s", id=f"{kind}{i}", data={"order_id": key, "n": i}, **kw
    )


def pairs(outcomes: list[Any]) -> list[list[tuple[str, str]]]:
    """Per input event, the (order n, payment n) of the joined events it emitted."""
    return [[(e.data["order"]["n"], e.data["payment"]["n"]) for e in out] for out in outcomes]


def stats(r: PipelineRunner) -> dict[str, int]:
    return {k: v for k, v in r.stats()["paid"].items() if k.startswith("absorbed_") and v}


O1P1P2O2 = [ev("o", "1"), ev("p", "1"), ev("p", "2"), ev("o", "2")]


@pytest.mark.parametrize("batched", [True, False])
def test_every_emits_every_pair_of_the_window(store: str | None, batched: bool) -> None:
    r = make(store)
    out = r.run(O1P1P2O2) if batched else [o for e in O1P1P2O2 for o in r.run([e])]
    assert pairs(out) == [[], [("1", "1")], [("1", "2")], [("2", "1"), ("2", "2")]]
    ids = [e.id for o in out for e in o]
    assert len(set(ids)) == 4
    assert stats(r) == {"absorbed_waiting": 1}


def test_every_is_the_default_through_the_public_runner() -> None:
    yaml = """
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: shop}
spec:
  sources: [{kafka: {topic: in}}]
  steps:
    - id: paid
      join:
        sides:
          - {name: order,   when: "type == 'order.created'",   key: data.order_id}
          - {name: payment, when: "type == 'payment.created'", key: data.order_id}
  sink: {kafka: {topic: out}}
"""
    result = run_pipeline(yaml, O1P1P2O2)
    got = sorted((e.data["order"]["n"], e.data["payment"]["n"]) for e in result.outputs)
    assert got == [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")]


def test_first_emits_one_event_and_counts_the_rest(store: str | None) -> None:
    r = make(store, emit="first")
    assert pairs(r.run(O1P1P2O2)) == [[], [("1", "1")], [], []]
    assert stats(r) == {"absorbed_waiting": 1, "absorbed_after_match": 2}
    r2 = make(store, emit="first")
    assert pairs(r2.run([ev("o", "1"), ev("o", "2"), ev("p", "1")])) == [[], [], [("2", "1")]]
    assert stats(r2) == {"absorbed_waiting": 1, "absorbed_superseded": 1}


def test_latest_pairs_each_event_with_the_latest_of_the_other_side(store: str | None) -> None:
    r = make(store, emit="latest")
    out = r.run(O1P1P2O2)
    assert pairs(out) == [[], [("1", "1")], [("1", "2")], [("2", "2")]]
    assert stats(r) == {"absorbed_waiting": 1, "absorbed_superseded": 2}


@pytest.mark.parametrize("emit", ["every", "latest"])
def test_an_event_consumed_again_re_emits_the_same_events(store: str | None, emit: str) -> None:
    r = make(store, emit=emit)
    first = r.run(O1P1P2O2)
    again = r.run(list(reversed(O1P1P2O2)))  # after a crash, in any order
    assert [[e.id for e in o] for o in again] == [[e.id for e in o] for o in reversed(first)]
    assert [[e.data for e in o] for o in again] == [[e.data for e in o] for o in reversed(first)]


def test_three_sides_emit_every_combination_once(store: str | None) -> None:
    sides = [*SIDES, {"name": "ship", "when": "type == 'ship'", "key": "data.order_id"}]
    r = make(store, sides)
    ship = CloudEvent.create(type="ship", source="/s", id="s1", data={"order_id": "k1"})
    out = r.run([ev("o", "1"), ev("p", "1"), ev("o", "2"), ship, ev("p", "2")])
    assert [len(o) for o in out] == [0, 0, 0, 2, 2]
    combos = {(e.data["order"]["n"], e.data["payment"]["n"]) for o in out for e in o}
    assert combos == {("1", "1"), ("2", "1"), ("1", "2"), ("2", "2")}


def later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move the join's clock forward (windows close on the wall clock)."""
    import eventbus.pipelines.steps._join as join_module

    real = join_module.now_ms
    monkeypatch.setattr(join_module, "now_ms", lambda: real() + int(seconds * 1000))


def test_outer_every_emits_each_unmatched_event_when_the_window_closes(
    store: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = make(store, mode="outer", window_s=60)
    r.run([ev("o", "1"), ev("o", "2"), ev("o", "3", key="k2"), ev("p", "3", key="k2")])
    [sweeper] = r.timers()
    assert sweeper.sweep() == ([], [], [])
    later(monkeypatch, 61)
    outputs, dead, claimed = sweeper.sweep()
    assert sorted(e.data["order"]["n"] for e in outputs) == ["1", "2"]
    assert all(e.data["_missing"] == ["payment"] for e in outputs) and not dead
    assert len({e.id for e in outputs}) == 2
    sweeper.forget(claimed)
    assert sweeper.sweep() == ([], [], [])
    assert r.stats()["paid"]["pending_keys"] == 0


def test_inner_every_counts_expired_events(
    store: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = make(store, window_s=60)
    r.run([ev("o", "1"), ev("o", "2")])
    later(monkeypatch, 61)
    [sweeper] = r.timers()
    outputs, dead, claimed = sweeper.sweep()
    assert outputs == [] and dead == [] and len(claimed) == 1
    assert stats(r) == {"absorbed_waiting": 2, "absorbed_expired": 2}


def test_an_event_after_the_window_opens_a_new_one(
    store: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = make(store, mode="outer", window_s=60)
    [sweeper] = r.timers()
    r.run([ev("o", "1")])
    later(monkeypatch, 61)
    # the closed window was not swept yet: p1 does not join o1, it opens a new window
    assert pairs(r.run([ev("p", "1")])) == [[]]
    assert pairs(r.run([ev("o", "2")])) == [[("2", "1")]]
    outputs, _, claimed = sweeper.sweep()
    assert [e.data["order"]["n"] for e in outputs] == ["1"]  # the old window's partial
    sweeper.forget(claimed)
    assert r.stats()["paid"]["pending_keys"] == 1  # the new window


def test_a_window_claimed_then_reopened_is_forgotten_by_its_own_t0(
    store: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = make(store, mode="outer", window_s=60)
    [sweeper] = r.timers()
    r.run([ev("o", "1")])
    later(monkeypatch, 61)
    outputs, _, claimed = sweeper.sweep()
    assert [e.data["order"]["n"] for e in outputs] == ["1"]
    r.run([ev("p", "1")])  # before the sweep is acknowledged: a new window under the key
    sweeper.forget(claimed)
    assert pairs(r.run([ev("o", "2")])) == [[("2", "1")]]  # the new window survived the ack


@pytest.mark.parametrize("emit", ["every", "first", "latest"])
def test_max_pending_dead_letters_unmatched_events(store: str | None, emit: str) -> None:
    r = make(store, emit=emit, max_pending=2)
    r.run([ev("o", "1", key="a"), ev("p", "1", key="a")])  # matched
    r.run([ev("o", "2", key="b")])
    r.run([ev("o", "3", key="c")])
    r.run([ev("o", "4", key="d")])
    [sweeper] = r.timers()
    outputs, dead, _ = sweeper.sweep()
    assert outputs == []
    assert [e.id for e in dead] == ["o2"]  # every/latest: 'a' went first, but it had matched
    assert all(
        e["eberrortype"] == "JoinEvictedError" and "max_pending (2)" in e["eberror"] for e in dead
    )
    assert r.stats()["paid"]["absorbed_evicted"] == len(dead)


def test_max_key_bytes_dead_letters_what_the_window_cannot_hold(store: str | None) -> None:
    r = make(store, max_key_bytes=1024)
    big = {"order_id": "k1", "pad": "x" * 300}
    evs = [ev("o", str(i)).replace(data={**big, "n": str(i)}) for i in range(4)]
    out = r.run(evs)
    assert out[:2] == [[], []]
    assert all(isinstance(f, Failure) and f.error_type == "JoinKeyFullError" for f in out[2:])
    assert "max_key_bytes is 1024; raise max_key_bytes" in out[2].message  # type: ignore[union-attr]
    assert stats(r) == {"absorbed_waiting": 2, "absorbed_key_full": 2}


def test_late_events_are_counted_and_failed(store: str | None) -> None:
    r = make(store, time="event", window_s=60)
    assert r.run([ev("o", "2", time="2024-01-01T00:10:00Z")]) == [[]]
    [f] = r.run([ev("o", "1", time="2020-01-01T00:00:00Z")])
    assert isinstance(f, Failure) and f.error_type == "LateEventError"
    assert stats(r) == {"absorbed_late": 1, "absorbed_waiting": 1}


@pytest.mark.parametrize("emit", ["every", "first", "latest"])
def test_redis_and_memory_agree(redis_url: str, emit: str) -> None:
    rnd = random.Random(7)
    evs = [ev(rnd.choice("op"), str(i), key=f"k{rnd.randrange(6)}") for i in range(300)]
    batches = [evs[i : i + rnd.randrange(1, 40)] for i in range(0, 300, 40)]
    outs = []
    for store in (None, redis_url):
        r = make(store, emit=emit)
        got = [[e.data for e in o] for b in batches for o in r.run(b)]
        outs.append((got, stats(r)))
    assert outs[0] == outs[1]
    if emit == "every":  # every order pairs with every payment of its key
        by_key = Counter((e.type[0], e.data["order_id"]) for b in batches for e in b)
        total = sum(by_key[("o", k)] * by_key[("p", k)] for k in {k for _, k in by_key})
        assert sum(len(o) for o in outs[0][0]) == total > 0


@pytest.mark.parametrize("emit", ["first", "latest"])
def test_three_sides_in_the_other_emit_modes(store: str | None, emit: str) -> None:
    sides = [*SIDES, {"name": "ship", "when": "type == 'ship'", "key": "data.order_id"}]
    r = make(store, sides, emit=emit)
    ship = CloudEvent.create(type="ship", source="/s", id="s1", data={"order_id": "k1"})
    out = r.run([ev("o", "1"), ev("p", "1"), ev("o", "2"), ship, ev("p", "2")])
    got = [
        [
            (
                e.data["order"]["n"],
                e.data["payment"]["n"],
                e.data["ship"].get("n", "s"),
            )
            for e in o
        ]
        for o in out
    ]  # type: ignore[union-attr]
    if emit == "first":  # one event, when the third side arrives; o2 had superseded o1
        assert got == [[], [], [], [("2", "1", "s")], []]
        assert stats(r) == {
            "absorbed_waiting": 2,
            "absorbed_superseded": 1,
            "absorbed_after_match": 1,
        }
    else:  # each event with the latest of every other side, once all are present
        assert got == [[], [], [], [("2", "1", "s")], [("2", "2", "s")]]


def test_three_sides_outer_emits_every_combination_of_what_is_present(
    store: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    sides = [*SIDES, {"name": "ship", "when": "type == 'ship'", "key": "data.order_id"}]
    r = make(store, sides, mode="outer", window_s=60)
    r.run([ev("o", "1"), ev("o", "2"), ev("p", "1")])  # no shipment
    later(monkeypatch, 61)
    [sweeper] = r.timers()
    outputs, dead, _ = sweeper.sweep()
    assert dead == [] and all(e.data["_missing"] == ["ship"] for e in outputs)
    assert sorted((e.data["order"]["n"], e.data["payment"]["n"]) for e in outputs) == [
        ("1", "1"),
        ("2", "1"),
    ]


@pytest.mark.parametrize("emit", ["every", "first"])
def test_flush_closes_every_window_at_the_end_of_the_input(store: str | None, emit: str) -> None:
    """``eventbus test`` and ``run_pipeline`` flush at the end of a case: outer joins emit what
    is present (without waiting for the clock), inner joins count what waited as expired."""
    outer = make(store, mode="outer", window_s=3600, emit=emit)
    outer.run([ev("o", "1"), ev("o", "3", key="k2"), ev("p", "3", key="k2")])
    flushed = outer.flush()
    assert [(e.data["order"]["n"], e.data["_missing"]) for e in flushed] == [("1", ["payment"])]
    assert outer.flush() == [] and outer.stats()["paid"]["pending_keys"] == 0
    inner = make(store, window_s=3600, emit=emit)
    inner.run([ev("o", "1"), ev("o", "2", key="k2")])
    assert inner.flush() == []
    assert stats(inner)["absorbed_expired"] == 2


def test_flush_of_an_event_time_join_starts_the_watermark_afresh() -> None:
    r = make(None, mode="outer", window_s=60, time="event")
    r.run(
        [
            ev("o", "1", time="2026-01-01T10:00:00Z"),
            ev("o", "2", key="k2", time="2026-01-01T12:00:00Z"),
        ]
    )
    assert sorted(e.data["order"]["n"] for e in r.flush()) == ["1", "2"]
    # the next case starts earlier than the last one's watermark: not late
    out = r.run(
        [ev("o", "3", time="2026-01-01T09:00:00Z"), ev("p", "3", time="2026-01-01T09:00:01Z")]
    )
    assert pairs(out) == [[], [("3", "3")]]


def test_eventbus_test_case_file_of_the_join_example() -> None:
    from pathlib import Path

    from eventbus.pipelines._testing import run_test_file

    root = Path(__file__).resolve().parents[3]
    results = run_test_file(root / "examples/join/paid_test.yaml")
    assert [(r.name, r.diffs) for r in results if not r.passed] == []
    assert len(results) == 2


def test_joins_ask_for_their_events_in_order() -> None:
    """A join's state depends on the order of its events: its sources hold the batches after
    one whose dispatch failed until its retry got through (``FetchSettings.in_order``);
    a pipeline of filters does not ask for it."""
    assert make(None).in_order
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "plain"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [{"id": "f", "filter": "true"}],
            "sink": {"kafka": {"topic": "out"}},
        },
    }
    assert not PipelineRunner(PipelineConfig.model_validate(doc)).in_order
