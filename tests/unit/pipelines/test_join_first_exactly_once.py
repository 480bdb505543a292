"""A join with ``emit: first`` under ``delivery: {guarantee: exactly_once}`` (event time,
state in Redis): it keeps its windows as ``emit: every`` does, so the consumed batches close
them (an outer join emits the incomplete ones as outputs of the batch's last stored event) and
an event consumed again, even after its window closed, emits what it emitted the first time,
with the same ids. On the session's real Redis scripts."""

from __future__ import annotations

from collections import Counter

import pytest

from eventbus.eventing._outcome import Failure
from tests.unit.pipelines.test_join_exactly_once import (
    T0,
    A,
    B,
    emitted,
    ev,
    key_of,
    make,
    partial,
    run,
    stream,
)

pytestmark = pytest.mark.redis


def test_the_first_complete_combination_is_emitted_once_and_the_rest_absorbed(
    redis_url: str,
) -> None:
    runner, step = make(redis_url, emit="first")
    assert step.stream  # the windows of every event, not the emit: first hashes
    out = emitted(
        run(
            runner,
            [
                ev("order", "k1", T0, "o1"),
                ev("order", "k1", T0 + 10, "o2"),  # supersedes o1
                ev("payment", "k1", T0 + 20, "p1"),  # completes k1: o2 + p1
                ev("payment", "k1", T0 + 30, "p2"),  # after the match
                ev("order", "k2", T0 + 40, "q1"),
                ev("order", "k2", T0 + 50, "q2"),  # k2 stays incomplete
            ],
        )
    )
    assert [(i, e.data) for i, e in out] == [
        (2, {"order": {"k": "k1", "eid": "o2"}, "payment": {"k": "k1", "eid": "p1"}})
    ]
    assert step.counters["absorbed_superseded"] == 2
    assert step.counters["absorbed_after_match"] == 1
    closed = emitted(run(runner, [ev("order", "z", T0 + 5_000, "z")]))
    # one output for the incomplete key, its latest event per side
    assert [e.data for _, e in closed] == [
        {"order": {"k": "k2", "eid": "q2"}, "_missing": ["payment"]}
    ]
    assert [t.fire() for t in step.timers()] == [None]  # nothing left to the sweeper


@pytest.mark.parametrize(("mode", "cut"), [("outer", 1), ("outer", 40), ("inner", 7)])
def test_a_batch_consumed_again_after_its_windows_closed_emits_the_same_outputs(
    redis_url: str, mode: str, cut: int
) -> None:
    part_a, part_b = stream(cut, 300)
    again = part_a[120:260]
    plan = [(part_a[:120], A), (part_b[:150], B)]
    rest = [(part_a[260:], A), (part_b[250:], B), ([ev("order", "z", T0 + 60_000, "z")], A)]
    ref_runner, _ = make(redis_url, mode=mode, emit="first", allowed_lateness_s=5)
    whole = [*plan, (again, A), (part_b[150:250], B), *rest]
    reference = [e for batch, lane in whole for _, e in emitted(run(ref_runner, batch, lane))]

    runner, step = make(redis_url, mode=mode, emit="first", allowed_lateness_s=5)
    committed = [e for batch, lane in plan for _, e in emitted(run(runner, batch, lane))]
    aborted = emitted(run(runner, again, A))  # its transaction aborts: nothing of it visible
    assert len(aborted) > 10
    # the other partition meanwhile: the watermark passes every window of `again`
    committed += [e for _, e in emitted(run(runner, part_b[150:250], B))]
    assert [t.fire() for t in step.timers()] == [None]
    replay = []
    for s in range(0, len(again), cut):  # consumed again from the committed offset
        outcomes = run(runner, again[s : s + cut], A)
        assert not any(isinstance(o, Failure) for o in outcomes)  # none late
        replay += [(s + i, e) for i, e in emitted(outcomes)]
    assert [(i, key_of(e)) for i, e in replay] == [(i, key_of(e)) for i, e in aborted]
    committed += [e for _, e in replay]
    for batch, lane in rest:
        committed += [e for _, e in emitted(run(runner, batch, lane))]
    got = Counter(key_of(e) for e in committed)
    assert got == Counter(key_of(e) for e in reference)
    assert max(got.values()) == 1
    if mode == "outer":
        assert sum(partial(e) for e in committed) > 10
    else:
        assert not any(partial(e) for e in committed) and step.counters["absorbed_expired"] > 0


def test_hostile_keys_and_ids_close_and_replay_by_their_exact_bytes(redis_url: str) -> None:
    runner, _ = make(redis_url, emit="first")
    keys = ["a:b", "a", "b:a", "x\x00y", "é✓", ":", "k" * 10_000, "1:a", "order/x"]
    batch = [ev("order", k, T0 + i, f"order/{i}:\x00") for i, k in enumerate(keys)]
    batch += [ev("payment", "a", T0 + 100, "a:b"), ev("payment", "a", T0 + 101, "a:c")]
    first = emitted(run(runner, batch))
    assert [i for i, _ in first] == [len(keys)]  # 'a' completes once, the others stay partial
    closer = [ev("order", "z", T0 + 5_000, "z:z")]
    shut = emitted(run(runner, closer))
    assert sorted(e.data["order"]["k"] for _, e in shut) == sorted(set(keys) - {"a"})
    # consumed again (the transactions aborted): the same outputs, the same ids
    assert [key_of(e) for _, e in emitted(run(runner, closer))] == [key_of(e) for _, e in shut]
    again = emitted(run(runner, batch))
    assert [(i, key_of(e)) for i, e in again] == [(i, key_of(e)) for i, e in first]
