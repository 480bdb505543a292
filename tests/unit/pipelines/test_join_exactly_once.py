"""An outer join under ``delivery: {guarantee: exactly_once}`` (event time, state in Redis):
the consumed batches close the windows and emit the incomplete ones, each as an output of the
batch's last stored event (the sweeper only dead-letters evictions); a batch consumed again
after an aborted transaction, cut otherwise, with another partition's batches stored
meanwhile, emits the same outputs with the same ids, and the committed outputs are those of a
run without the abort, each once (see docs/concepts/delivery.md, "Outer joins under exactly
once"). On the session's real Redis scripts."""

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
from eventbus.pipelines.steps import _join
from eventbus.pipelines.steps._join import JoinStep
from eventbus.pipelines.steps._join_output import format_time_ms

pytestmark = pytest.mark.redis

SIDES = [
    {"name": "order", "when": "type == 'order'", "key": "data.k"},
    {"name": "payment", "when": "type == 'payment'", "key": "data.k"},
]
T0 = 1_714_564_800_000  # 2024-05-01T12:00:00Z
A, B = "in[0]", "in[1]"


def make(url: str, **join: Any) -> tuple[PipelineRunner, JoinStep]:
    spec = {"sides": SIDES, "mode": "outer", "time": "event", "window_s": 2, **join}
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": f"j{uuid.uuid4().hex[:10]}"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [{"id": "paid", "join": spec}],
            "sink": {"kafka": {"topic": "out"}},
            "delivery": {"guarantee": "exactly_once"},
        },
    }
    runner = PipelineRunner(PipelineConfig.model_validate(doc), redis_url=url)
    step = runner.steps[0]
    assert isinstance(step, JoinStep) and step.closing
    step.now = lambda: T0 + 3_600_000  # type: ignore[method-assign]  # every lane active
    return runner, step


def ev(side: str, key: str, t_ms: int, eid: str) -> CloudEvent:
    data = {"k": key, "eid": eid}
    return CloudEvent.create(type=side, source="/s", id=eid, time=format_time_ms(t_ms), data=data)


def run(runner: PipelineRunner, batch: list[CloudEvent], lane: str = A) -> list[Any]:
    return runner.run(batch, origins=[lane] * len(batch))


def emitted(outcomes: list[Any]) -> list[tuple[int, CloudEvent]]:
    """(index in the batch, output) of what a run emitted (failures left out)."""
    return [(i, e) for i, out in enumerate(outcomes) if isinstance(out, list) for e in out]


def partial(e: CloudEvent) -> bool:
    return "_missing" in e.data


def test_a_batch_closes_the_incomplete_windows_as_its_last_events_outputs(
    redis_url: str,
) -> None:
    runner, step = make(redis_url)
    first = [
        ev("order", "k1", T0, "o1"),
        ev("payment", "k1", T0 + 500, "p1"),
        ev("order", "k2", T0 + 1_000, "o2"),
    ]
    out = emitted(run(runner, first))
    assert [(i, partial(e)) for i, e in out] == [(1, False)]  # k1 joined, k2 waits
    # the watermark passes k1's and k2's windows: the batch's last stored event emits k2's
    # window with its missing side; k1's completed window emits nothing more
    second = [ev("order", "k3", T0 + 2_500, "o3"), ev("order", "k4", T0 + 3_000, "o4")]
    out = emitted(run(runner, second))
    assert [(i, e.data) for i, e in out] == [(1, {"order": first[2].data, "_missing": ["payment"]})]
    assert step.stats()["timed_out"] == 1
    # the sweeper emits nothing under exactly_once (no transaction would cover it)
    assert [t.fire() for t in step.timers()] == [None]
    # a batch of late events only: no stored event, no closer; the next batch closes
    late = run(runner, [ev("order", "k9", T0, "o9")])
    assert isinstance(late[0], Failure) and late[0].error_type == "LateEventError"
    out = emitted(run(runner, [ev("order", "k5", T0 + 6_000, "o5")]))
    assert sorted(e.data["order"]["k"] for _, e in out) == ["k3", "k4"]


def stream(seed: int, n: int) -> tuple[list[CloudEvent], list[CloudEvent]]:
    """Two partitions' events over 40 keys, one each 100 ms, a random side each."""
    rng = random.Random(seed)

    def part(name: str, shift: int) -> list[CloudEvent]:
        out = []
        for i in range(n):
            side = rng.choice(["order", "payment"])
            out.append(ev(side, f"k{rng.randrange(40)}", T0 + i * 100 + shift, f"{name}{i}"))
        return out

    return part("a", 0), part("b", 50)


def key_of(e: CloudEvent) -> tuple[str, str]:
    return e.id, repr(sorted(e.data.items()))


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_a_batch_consumed_again_in_other_cuts_emits_the_same_outputs_once(
    redis_url: str, cut: int
) -> None:
    part_a, part_b = stream(cut, 300)
    again = part_a[120:260]
    plan = [(part_a[:120], A), (part_b[:150], B), (again, A), (part_b[150:250], B)]
    rest = [(part_a[260:], A), (part_b[250:], B), ([ev("order", "z", T0 + 60_000, "z")], A)]
    # the reference: the same batches, no abort
    ref_runner, _ = make(redis_url, allowed_lateness_s=5)
    reference = [e for batch, lane in plan + rest for _, e in emitted(run(ref_runner, batch, lane))]

    runner, step = make(redis_url, allowed_lateness_s=5)
    committed = emitted(run(runner, *plan[0])) + emitted(run(runner, *plan[1]))
    aborted = emitted(run(runner, again, A))  # its transaction aborts: nothing of it visible
    assert any(partial(e) for _, e in aborted), "the aborted attempt closed no window"
    committed += emitted(run(runner, *plan[3]))  # the other partition meanwhile
    replay: list[tuple[int, CloudEvent]] = []
    for s in range(0, len(again), cut):  # consumed again from the committed offset
        replay += [(s + i, e) for i, e in emitted(run(runner, again[s : s + cut], A))]
    assert [(i, key_of(e)) for i, e in replay] == [(i, key_of(e)) for i, e in aborted]
    committed += replay
    for batch, lane in rest:
        committed += emitted(run(runner, batch, lane))
    got = Counter(key_of(e) for _, e in committed)
    assert got == Counter(key_of(e) for e in reference)
    assert max(got.values()) == 1
    assert sum(partial(e) for _, e in committed) > 10  # the property covers many windows
    assert [t.fire() for t in step.timers()] == [None]


@pytest.mark.parametrize(
    ("limit", "size", "per_batch"), [("CLOSE_LIMIT", 2, [2, 2, 1]), ("CLOSE_BYTES", 1, [1] * 5)]
)
def test_one_batch_closes_at_most_the_close_limit(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, limit: str, size: int, per_batch: list[int]
) -> None:
    # by the number of windows, or by their bytes (at least one window a batch)
    monkeypatch.setattr(_join, limit, size)
    runner, _ = make(redis_url)
    run(runner, [ev("order", f"k{i}", T0 + i, f"o{i}") for i in range(5)])
    closed: list[str] = []
    for n, want in enumerate(per_batch):  # the windows beyond the limit stay due
        batch = [ev("payment", f"x{n}", T0 + 10_000 + n, f"p{n}")]
        out = emitted(run(runner, batch))
        assert len(out) == want
        closed += [e.data["order"]["k"] for _, e in out]
    assert sorted(closed) == [f"k{i}" for i in range(5)]


def test_hostile_keys_and_ids_close_and_replay_by_their_exact_bytes(redis_url: str) -> None:
    runner, _ = make(redis_url)
    keys = ["a:b", "a", "b:a", "x\x00y", "é✓", ":", "k" * 10_000, "1:a"]
    batch = [ev("order", k, T0 + i, f"id:{i}:\x00") for i, k in enumerate(keys)]
    batch += [ev("payment", "a", T0 + 100, "a:b")]  # 'a' completes, the others stay partial
    assert len(emitted(run(runner, batch))) == 1
    closer = [ev("order", "z", T0 + 5_000, "z:z")]
    first = emitted(run(runner, closer))
    assert sorted(e.data["order"]["k"] for _, e in first) == sorted(set(keys) - {"a"})
    # consumed again (its transaction aborted): the same outputs, nothing stored twice
    assert [key_of(e) for _, e in emitted(run(runner, closer))] == [key_of(e) for _, e in first]
    assert len(emitted(run(runner, batch))) == 1  # the events of closed windows: the same
    assert emitted(run(runner, [ev("order", "q", T0 + 6_000, "q")])) == []


def test_an_evicted_window_goes_to_the_dead_letter_sink_not_to_the_outputs(
    redis_url: str,
) -> None:
    runner, step = make(redis_url, max_pending=2)
    run(runner, [ev("order", f"k{i}", T0 + i, f"o{i}") for i in range(3)])  # k0 is evicted
    fired = [t.fire() for t in step.timers()]
    assert fired[0] is not None and [e.data["k"] for e in fired[0].dead] == ["k0"]
    out = emitted(run(runner, [ev("order", "z", T0 + 5_000, "z")]))
    assert sorted(e.data["order"]["k"] for _, e in out) == ["k1", "k2"]


def test_a_window_before_1970_is_closed_by_a_batch_not_the_sweeper(redis_url: str) -> None:
    runner, step = make(redis_url, max_ahead_s=366 * 86400)
    step.now = lambda: 10_000  # type: ignore[method-assign]
    run(runner, [ev("order", "old", -5_000, "o1")])
    assert [t.fire() for t in step.timers()] == [None]
    out = emitted(run(runner, [ev("order", "new", 5_000, "o2")]))
    assert [e.data["order"]["k"] for _, e in out] == ["old"]


def sweep(step: JoinStep) -> None:
    """Run the step's sweepers as the platform does between batches (under exactly_once they
    take only evicted windows)."""
    for timer in step.timers():
        fired = timer.fire()
        if fired is not None:
            timer.ack(fired)


@pytest.mark.parametrize("cut", [1, 40])
def test_an_inner_join_replayed_after_its_windows_closed_pairs_as_the_first_time(
    redis_url: str, cut: int
) -> None:
    # the aborted batch's windows are closed by the other partition's batches (and swept)
    # before it is consumed again: its events find their closed windows and pair as before
    part_a, part_b = stream(cut, 300)
    again = part_a[120:260]
    runner, step = make(redis_url, mode="inner")
    run(runner, part_a[:120], A)
    run(runner, part_b[:150], B)
    aborted = emitted(run(runner, again, A))
    assert len(aborted) > 20 and not any(partial(e) for _, e in aborted)
    run(runner, part_b[150:], B)  # the watermark passes every window of `again`
    sweep(step)
    replay: list[tuple[int, CloudEvent]] = []
    for s in range(0, len(again), cut):
        outcomes = run(runner, again[s : s + cut], A)
        assert not any(isinstance(o, Failure) for o in outcomes)  # none late
        replay += [(s + i, e) for i, e in emitted(outcomes)]
    assert [(i, key_of(e)) for i, e in replay] == [(i, key_of(e)) for i, e in aborted]
    assert step.counters["absorbed_expired"] > 0  # incomplete windows closed, not emitted


def test_an_inner_join_closes_incomplete_windows_without_outputs(redis_url: str) -> None:
    runner, step = make(redis_url, mode="inner")
    run(runner, [ev("order", "k1", T0, "o1"), ev("order", "k2", T0, "o2")])
    paid = emitted(run(runner, [ev("payment", "k1", T0 + 100, "p1")]))
    assert emitted(run(runner, [ev("order", "z", T0 + 10_000, "z")])) == []
    assert step.counters["absorbed_expired"] == 1  # k2's order (k1 paired: complete)
    sweep(step)
    # k1's payment consumed again after its window closed: the same pair, the same id
    first = emitted(run(runner, [ev("payment", "k1", T0 + 100, "p1")]))
    pair = {"order": {"k": "k1", "eid": "o1"}, "payment": {"k": "k1", "eid": "p1"}}
    assert [e.data for _, e in first] == [pair]
    assert [key_of(e) for _, e in first] == [key_of(e) for _, e in paid]
