"""An aggregate under ``delivery: {guarantee: exactly_once}`` (state in Redis): the consumed
batches close the windows, each as an output of the batch's last applied event (no timer);
a batch consumed again after an aborted transaction, cut otherwise, with other partitions'
batches merged meanwhile, is not counted twice and re-emits the windows it closed, with the
same ids and values (see docs/concepts/delivery.md, "Aggregates under exactly once")."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
import redis

from eventbus._internal import keys
from eventbus.eventing._event import CloudEvent
from eventbus.pipelines._runner import PipelineRunner
from eventbus.pipelines.steps._aggregate import AggregateStep
from eventbus.pipelines.steps._aggregate_close import REPLAY_S
from tests.unit.pipelines.test_aggregate import T0, by_window, ev, iso, make

pytestmark = pytest.mark.redis

EOS = {"guarantee": "exactly_once"}


def eos(url: str, **agg: Any) -> tuple[PipelineRunner, AggregateStep]:
    runner, step = make(url, EOS, **agg)
    assert step.closing and runner.timers() == []  # the batches close the windows
    return runner, step


def emitted(outcomes: list[Any]) -> list[tuple[int, CloudEvent]]:
    """(batch index, window event) of what a run emitted."""
    return [(i, e) for i, out in enumerate(outcomes) for e in out]


def test_a_batch_closes_the_windows_its_watermark_passed_as_its_last_events_outputs(
    redis_url: str,
) -> None:
    runner, step = eos(redis_url, window={"tumbling": {"size_s": 10}})
    first = [ev("a", T0 + 1_000, 2, 0), ev("b", T0 + 2_000, 3, 1), ev("a", T0 + 3_000, 4, 2)]
    assert emitted(runner.run(first)) == []  # nothing due yet
    # the watermark passes [T0, T0+10s): the batch's last applied event emits both keys'
    # windows; the late event is dead-lettered, not a closer
    second = [ev("a", T0 + 12_000, 1, 3), ev("b", T0 + 15_000, 1, 4)]
    out = emitted(runner.run(second))
    assert [i for i, _ in out] == [1, 1]
    got = {k: (v["n"], v["total"]) for (k, _), v in by_window([e for _, e in out]).items()}
    assert got == {"a": (2, 6), "b": (1, 3)}
    late = runner.run([ev("a", T0 + 4_000, 1, 5)])
    assert late[0].__class__.__name__ == "Failure"
    assert step.stats()["windows_emitted"] == 2


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_a_batch_consumed_again_in_other_cuts_re_emits_the_same_windows_once(
    redis_url: str, cut: int
) -> None:
    runner, step = eos(redis_url, window={"tumbling": {"size_s": 10}}, allowed_lateness_s=15)
    rng = random.Random(cut)
    # partition A's events, one a 100 ms, 4 keys; partition B's events at the same times
    part_a = [ev(f"k{i % 4}", T0 + i * 100, rng.randrange(10), i) for i in range(300)]
    part_b = [ev(f"k{i % 4}", T0 + i * 100 + 50, rng.randrange(10), 1000 + i) for i in range(300)]
    committed = emitted(runner.run(part_a[:120])) + emitted(runner.run(part_b[:150]))
    again = part_a[120:260]
    aborted = emitted(runner.run(again))  # its transaction aborts: nothing of it visible
    assert aborted, "the aborted attempt closed no window: the test proves nothing"
    committed += emitted(runner.run(part_b[150:250]))  # another partition meanwhile
    # consumed again from the partition's committed offset, cut in other batches
    replay: list[tuple[int, CloudEvent]] = []
    for s in range(0, len(again), cut):
        replay += [(s + i, e) for i, e in emitted(runner.run(again[s : s + cut]))]
    assert [(i, e.id, e.data) for i, e in replay] == [(i, e.id, e.data) for i, e in aborted]
    committed += replay
    for batch in (part_a[260:], part_b[250:], [ev("z", T0 + 100_000, 0, 9999)]):
        committed += emitted(runner.run(batch))
    windows = [e for _, e in committed]
    ids = Counter(e.id for e in windows)
    assert max(ids.values()) == 1, ids.most_common(2)
    expect: Counter[tuple[str, str]] = Counter()
    sums: Counter[tuple[str, str]] = Counter()
    for e in [*part_a, *part_b]:
        t = T0 + (int(e.id.split("-")[0][1:]) % 1000) * 100
        w = (e.data["user"], iso(t - t % 10_000))
        expect[w] += 1
        sums[w] += e.data["amount"]
    got = by_window(windows)
    assert {w: v["n"] for w, v in got.items()} == dict(expect)
    assert {w: v["total"] for w, v in got.items()} == dict(sums)
    assert step.stats()["duplicate_events"] == len(again)


def test_hopping_and_session_windows_close_by_the_batches(redis_url: str) -> None:
    runner, _ = eos(redis_url, window={"hopping": {"size_s": 20, "advance_s": 10}})
    out = [
        e for _, e in emitted(runner.run([ev("a", T0 + 5_000, 1, 0), ev("a", T0 + 15_000, 1, 1)]))
    ]
    out += [e for _, e in emitted(runner.run([ev("a", T0 + 60_000, 1, 2)]))]
    assert {w[1]: v["n"] for w, v in by_window(out).items()} == {
        iso(T0 - 10_000): 1,
        iso(T0): 2,
        iso(T0 + 10_000): 1,
    }
    runner, _ = eos(redis_url, window={"session": {"gap_s": 5}})
    batch = [ev("a", T0, 1, 0), ev("a", T0 + 3_000, 1, 1), ev("b", T0 + 4_000, 1, 2)]
    assert emitted(runner.run(batch)) == []
    out = [e for _, e in emitted(runner.run([ev("c", T0 + 30_000, 1, 3)]))]
    assert {w: v["n"] for w, v in by_window(out).items()} == {
        ("a", iso(T0)): 2,
        ("b", iso(T0 + 4_000)): 1,
    }
    # the key's next session is a new one (its closed session left its index)
    out = [
        e for _, e in emitted(runner.run([ev("a", T0 + 31_000, 1, 4), ev("c", T0 + 60_000, 1, 5)]))
    ]
    assert {w: v["n"] for w, v in by_window(out).items()} == {
        ("a", iso(T0 + 31_000)): 1,
        ("c", iso(T0 + 30_000)): 1,
    }


def test_the_records_of_closed_windows_are_forgotten_after_the_replay_window(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, step = eos(redis_url, window={"tumbling": {"size_s": 10}})
    clock = [T0]
    monkeypatch.setattr(step, "now", lambda: clock[0])
    runner.run([ev("a", T0, 1, 0)])
    closer = ev("a", T0 + 20_000, 1, 1)
    assert len(emitted(runner.run([closer]))) == 1
    closed = keys.aggregate_keys(step.pipeline, step.id)[6]
    r = redis.Redis.from_url(redis_url)
    assert r.zcard(closed) == 1
    assert len(emitted(runner.run([closer]))) == 1  # consumed again: the same window
    clock[0] += int(REPLAY_S * 1000) + 1
    runner.run([ev("b", T0 + 21_000, 1, 2)])
    assert r.zcard(closed) == 0
    w = keys.aggregate_keys(step.pipeline, step.id)[0]
    assert not [f for f in r.hkeys(w) if f.startswith(b"X\0")]


def test_a_batch_closes_at_most_the_limit_and_the_next_batches_close_the_rest(
    redis_url: str,
) -> None:
    runner, step = eos(redis_url, window={"tumbling": {"size_s": 10}})
    step.close_limit = 7
    runner.run([ev(f"k{i}", T0 + i, 1, i) for i in range(20)])  # 20 keys' windows
    ahead = [ev("z", T0 + 60_000 + i, 1, 100 + i) for i in range(4)]
    outs = [[w for _, w in emitted(runner.run([e]))] for e in ahead]
    assert [len(o) for o in outs] == [7, 7, 6, 0]
    keys_closed = Counter(w.data["key"] for o in outs for w in o)
    assert set(keys_closed) == {f"k{i}" for i in range(20)} and max(keys_closed.values()) == 1
    # consumed again, the second closer gives its own seven again
    again = emitted(runner.run([ahead[1]]))
    assert len(again) == 7 and {e.data["key"] for _, e in again} <= {f"k{i}" for i in range(20)}


def test_no_timer_runs_under_exactly_once(redis_url: str) -> None:
    from eventbus.pipelines import pipeline_timers

    runner, _ = eos(redis_url, window={"tumbling": {"size_s": 10}})
    assert pipeline_timers(runner.config, redis_url) == []
    at_least_once, _ = make(redis_url, window={"tumbling": {"size_s": 10}})
    assert len(pipeline_timers(at_least_once.config, redis_url)) == 1
