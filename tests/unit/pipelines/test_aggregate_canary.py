"""Replicas of two script versions on one aggregate state (a canary beside the stable
version): the previous release's scripts (``_aggregate_lua_previous``, kept as they shipped)
and this one's take turns merging batches and closing windows of the same step, and every
window comes out as an independent count says. This version's lean layout (tumbling or
hopping with a count, no ``emit: update``) does not write a window's ``c``."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest
import redis

from eventbus._internal import keys
from eventbus.pipelines.steps._aggregate import AggregateStep
from eventbus.pipelines.steps._aggregate_lua import RedisAggregateState
from eventbus.pipelines.steps._aggregate_timer import AggregateTimer
from tests.unit.pipelines import _aggregate_lua_previous as previous
from tests.unit.pipelines.test_aggregate import T0, by_window, ev, iso, make

pytestmark = pytest.mark.redis

ALL = {
    "n": "count",
    "total": {"sum": "data.amount"},
    "mean": {"avg": "data.amount"},
    "lo": {"min": "data.amount"},
    "last": {"last": "data.amount"},
    "ks": {"collect": "data.amount", "max": 1000},
}


def states(step: AggregateStep, url: str) -> list[Any]:
    spec, pipeline = step.state_spec, step.pipeline
    return [
        RedisAggregateState(url, pipeline, step.id, spec),
        previous.RedisAggregateState(url, pipeline, step.id, spec),
    ]


def expected(events: list[tuple[str, int, int]], size_ms: int) -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for k, t, amount in events:
        out[(k, iso(t - t % size_ms))].append((t, amount))
    return {
        w: {
            "n": len(v),
            "total": sum(a for _, a in v),
            "mean": sum(a for _, a in v) / len(v),
            "lo": min(a for _, a in v),
            "last": max(v)[1],
            "ks": sorted(a for _, a in v),
        }
        for w, v in out.items()
    }


@pytest.mark.parametrize("emit", ["close", "update"])
def test_batches_and_closes_alternating_between_the_two_script_versions(
    redis_url: str, emit: str
) -> None:
    runner, step = make(redis_url, window={"tumbling": {"size_s": 10}}, emit=emit, aggregations=ALL)
    both = states(step, redis_url)
    timer = AggregateTimer(step)
    rng = random.Random(11)
    sent: list[tuple[str, int, int]] = []
    closed = []
    for b in range(40):  # 40 batches of 50 events, 100 s of event time, 8 keys
        batch = []
        for j in range(50):
            i = 50 * b + j
            sent.append(
                (f"k{rng.randrange(8)}", T0 + i * 50 + rng.randrange(50), rng.randrange(100))
            )
            batch.append(ev(sent[-1][0], sent[-1][1], sent[-1][2], i, v=0))
        step.state = both[b % 2]  # this batch merged by one version...
        out = runner.run(batch)
        assert all(o == [] or emit == "update" for o in out)
        step.state = both[(b // 3) % 2]  # ...and windows closed by either
        fired = timer.close(now=T0)
        timer.ack(fired)
        closed += fired.outputs
    step.state = both[0]
    closed += step.flush()
    got = {
        w: {k: v[k] for k in ALL} | {"ks": sorted(v["ks"]), "mean": pytest.approx(v["mean"])}
        for w, v in by_window(closed).items()
    }
    assert got == expected(sent, 10_000)
    w, due, claim = keys.aggregate_keys(step.pipeline, step.id)[:3]
    r = redis.Redis.from_url(redis_url)
    assert r.hlen(w) == 0 and r.zcard(due) == 0 and r.zcard(claim) == 0


def test_the_lean_layout_writes_no_c_and_the_previous_version_reads_it(redis_url: str) -> None:
    runner, step = make(redis_url, window={"tumbling": {"size_s": 60}})
    w = keys.aggregate_keys(step.pipeline, step.id)[0]
    r = redis.Redis.from_url(redis_url)
    runner.run([ev("a", T0 + 1, 2), ev("a", T0 + 2, 3), ev("b", T0 + 3, 4)])
    fields = {f.decode() for f in r.hkeys(w)}
    assert fields == {
        *(f"{T0}:{k}\0{s}" for k in "ab" for s in ("1", "2", "e")),
        "wm",
        "wmw",
    }
    # the previous version merges on and closes them: its add finds no 'c', writes the
    # window's end and due entry again with the same values
    step.state = states(step, redis_url)[1]
    runner.run([ev("a", T0 + 4, 5), ev("c", T0 + 70_000, 1)])
    got = {k: (v["n"], v["total"]) for (k, _), v in by_window(step.flush()).items()}
    assert got == {"a": (3, 10), "b": (1, 4), "c": (1, 1)}
    assert r.hlen(w) == 0


@pytest.mark.parametrize(
    "window",
    [{"hopping": {"size_s": 20, "advance_s": 10}}, {"session": {"gap_s": 5}}],
    ids=["hopping", "session"],
)
def test_hopping_and_session_windows_across_versions(
    redis_url: str, window: dict[str, Any]
) -> None:
    runner, step = make(redis_url, window=window)
    both = states(step, redis_url)
    times = [0, 3_000, 9_000, 12_000, 14_000, 31_000, 33_000, 60_000]
    for n, t in enumerate(times):
        step.state = both[n % 2]
        runner.run([ev("a", T0 + t, n + 1, n)])
    step.state = both[1]
    got = sorted((k[1], v["n"], v["total"]) for k, v in by_window(step.flush()).items())
    if "session" in window:
        expect = [(iso(T0 + s), n, tot) for s, n, tot in _sessions(times, 5_000)]
    else:
        expect = _hopping(times, 20_000, 10_000)
    assert got == sorted(expect)


def _sessions(times: list[int], gap: int) -> list[tuple[int, int, int]]:
    # (start, count, total) per session of the times in order; event n's amount is n + 1
    sessions: list[tuple[int, int, int]] = []
    group: list[int] = []
    for n, t in enumerate(times):
        if group and t >= times[group[-1]] + gap:
            sessions.append((times[group[0]], len(group), sum(g + 1 for g in group)))
            group = []
        group.append(n)
    sessions.append((times[group[0]], len(group), sum(g + 1 for g in group)))
    return sessions


def _hopping(times: list[int], size: int, adv: int) -> list[tuple[str, int, int]]:
    got: dict[int, list[int]] = defaultdict(list)
    for n, t in enumerate(times):
        start = t - t % adv
        while start > t - size:
            got[start].append(n + 1)
            start -= adv
    return [(iso(T0 + s), len(v), sum(v)) for s, v in got.items()]


def test_a_batch_applied_by_one_version_is_a_duplicate_to_the_other(redis_url: str) -> None:
    # delivery.dedupe across a canary: a replica of one version applies a batch and dies
    # before its commit; the other version gets the batch again (cut differently, 1,200
    # events: past the scripts' 1,000-digest chunks) and counts none of it twice
    runner, step = make(
        redis_url, {"dedupe": {"window_s": 600}}, window={"tumbling": {"size_s": 60}}
    )
    both = states(step, redis_url)
    rng = random.Random(3)
    evs = [ev(f"u{rng.randrange(30)}", T0 + rng.randrange(50_000), 1, i) for i in range(1200)]
    for first in (0, 1):
        step.state = both[first]
        runner.run(evs[600 * first : 600 * first + 600])
        step.state = both[1 - first]
        before = step.counters["duplicate_events"]
        runner.run(evs[: 600 * first + 600])  # replayed from the last commit
        assert step.counters["duplicate_events"] - before == 600 * first + 600  # all of it
    got = sum(w["n"] for w in by_window(step.flush()).values())
    assert got == 1200
