"""The aggregate step on the in-memory state and on the Redis scripts (the session's real
Redis), the same cases on both: tumbling, hopping and session windows against answers the
tests compute independently, late events to dead letters, idempotent re-emission, CEL
reducers, ``emit: update``, idle windows closed by the timer."""

from __future__ import annotations

import random
import re
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from eventbus import cel
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner
from eventbus.pipelines.steps._aggregate import AggregateStep
from eventbus.pipelines.steps._aggregate_config import AggregateConfig

T0 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000  # a minute boundary, ms


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest) -> str | None:
    """None (in-memory state) or the session Redis's URL."""
    return None if request.param == "memory" else request.getfixturevalue("redis_url")


def make(
    store: str | None, delivery: dict[str, Any] | None = None, **agg: Any
) -> tuple[PipelineRunner, AggregateStep]:
    agg.setdefault("key", "data.user")
    agg.setdefault("aggregations", {"n": "count", "total": {"sum": "data.amount"}})
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": f"a{uuid.uuid4().hex[:10]}"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [{"id": "per_user", "aggregate": agg}],
            "sink": {"kafka": {"topic": "out"}},
            "delivery": delivery or {},
        },
    }
    runner = PipelineRunner(PipelineConfig.model_validate(doc), redis_url=store)
    step = runner.steps[0]
    assert isinstance(step, AggregateStep)
    return runner, step


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def ev(user: str, t_ms: int, amount: float = 1, i: int = 0, **data: Any) -> CloudEvent:
    return CloudEvent.create(
        type="t",
        source="/s",
        id=f"e{i}-{uuid.uuid4().hex[:6]}",
        time=iso(t_ms),
        data={"user": user, "amount": amount, **data},
    )


def by_window(outputs: list[CloudEvent]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for e in outputs:
        d = dict(e.data)
        out[(d.pop("key"), d.pop("window_start"))] = d
    return out


def close_all(step: AggregateStep) -> list[CloudEvent]:
    return step.flush()


def test_tumbling_out_of_order_within_lateness_matches_an_independent_count(
    store: str | None,
) -> None:
    runner, step = make(store, window={"tumbling": {"size_s": 60}}, allowed_lateness_s=30)
    rng = random.Random(7)
    n, keys = 20_000, 100
    # event times advance ~3 ms per event; each is shuffled back by up to 20 s (< lateness)
    events = []
    for i in range(n):
        t = T0 + i * 3 - rng.randrange(20_000)
        events.append((f"u{rng.randrange(keys)}", t, rng.randrange(1, 100)))
    expect: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: {"n": 0, "total": 0})
    for user, t, amount in events:
        w = expect[(user, iso(t - t % 60_000))]
        w["n"] += 1
        w["total"] += amount
    outputs: list[CloudEvent] = []
    cloud = [ev(u, t, a, i) for i, (u, t, a) in enumerate(events)]
    for k in range(0, n, 1000):
        outcomes = runner.run(cloud[k : k + 1000])
        assert not [o for o in outcomes if isinstance(o, Failure)]
        fired = step.timers()[0].fire()  # windows closed by the watermark so far
        if fired is not None:
            outputs += fired.outputs
            step.timers()[0].ack(fired)
    assert step.stats()["open_windows"] > 0
    outputs += close_all(step)
    got = {k: {"n": v["n"], "total": v["total"]} for k, v in by_window(outputs).items()}
    assert got == dict(expect)
    assert len(outputs) == len(expect)
    stats = step.stats()
    assert stats["open_windows"] == 0 and stats["late_events"] == 0
    assert stats["windows_emitted"] == len(expect)


def test_hopping_windows_each_count_their_events(store: str | None) -> None:
    runner, step = make(store, window={"hopping": {"size_s": 60, "advance_s": 20}})
    times = [T0 + s * 1000 for s in (0, 15, 25, 45, 70, 119)]
    runner.run([ev("a", t, 1, i) for i, t in enumerate(times)])
    got = {k[1]: v["n"] for k, v in by_window(close_all(step)).items()}
    expect: dict[str, int] = defaultdict(int)
    for t in times:
        start = t - t % 20_000
        while start > t - 60_000:
            expect[iso(start)] += 1
            start -= 20_000
    assert got == dict(expect)


def test_session_windows_merge_when_a_late_event_bridges_them(store: str | None) -> None:
    runner, step = make(
        store,
        window={"session": {"gap_s": 10}},
        allowed_lateness_s=60,
        aggregations={
            "n": "count",
            "total": {"sum": "data.amount"},
            "seen": {"collect": "data.amount"},
        },
    )
    s = 1000
    runner.run([ev("a", T0, 1), ev("a", T0 + 5 * s, 2), ev("b", T0 + 1 * s, 7)])
    runner.run([ev("a", T0 + 30 * s, 4)])  # a's second session
    assert step.stats()["open_windows"] == 3
    runner.run([ev("a", T0 + 14 * s, 8), ev("a", T0 + 22 * s, 16)])  # bridges a's two sessions
    windows = by_window(close_all(step))
    assert windows[("a", iso(T0))]["n"] == 5
    assert windows[("a", iso(T0))]["total"] == 31
    assert windows[("a", iso(T0))]["window_end"] == iso(T0 + 40 * s)
    assert sorted(windows[("a", iso(T0))]["seen"]) == [1, 2, 4, 8, 16]
    assert windows[("b", iso(T0 + s))]["total"] == 7
    assert len(windows) == 2


def test_late_events_fail_with_the_reason_and_are_counted(store: str | None) -> None:
    runner, step = make(store, window={"tumbling": {"size_s": 60}}, allowed_lateness_s=5)
    runner.run([ev("a", T0 + 1000), ev("a", T0 + 66_000)])  # watermark: T0 + 66 s
    out = runner.run([ev("a", T0 + 2000), ev("a", T0 + 61_000)])
    assert isinstance(out[0], Failure) and out[0].error_type == "AggregateLateEventError"
    assert "raise allowed_lateness_s" in out[0].message and "'a'" in out[0].message
    assert out[1] == []
    assert step.stats()["late_events"] == 1
    windows = by_window(close_all(step))
    assert [w["n"] for w in windows.values()] == [1, 2]


def test_lateness_within_one_batch_is_judged_in_arrival_order(store: str | None) -> None:
    runner, step = make(store, window={"tumbling": {"size_s": 60}}, allowed_lateness_s=5)
    out = runner.run([ev("a", T0 + 1000), ev("a", T0 + 66_000), ev("a", T0 + 2000)])
    assert out[:2] == [[], []] and isinstance(out[2], Failure)
    assert step.stats()["late_events"] == 1


def test_eventbus_test_case_file_of_the_example() -> None:
    from pathlib import Path

    from eventbus.pipelines._testing import run_test_file

    root = Path(__file__).resolve().parents[3]
    results = run_test_file(root / "examples/aggregate/spend_test.yaml")
    assert [(r.name, r.diffs) for r in results if not r.passed] == []
    assert len(results) == 2


def test_a_window_claimed_again_after_a_crash_has_the_same_id(store: str | None) -> None:
    runner, step = make(store, window={"tumbling": {"size_s": 60}})
    runner.run([ev("a", T0 + 1000), ev("b", T0 + 2000), ev("a", T0 + 61_000)])
    timer = step.timers()[0]
    first = timer.fire()  # emitted, never acked (the timer's process died)
    assert first is not None and len(first.outputs) == 2
    assert timer.fire() is None  # claimed: nobody else emits it meanwhile
    now = step.now()
    step.now = lambda: now + 31_000  # type: ignore[method-assign]
    again = timer.fire()  # the lease ran out
    assert again is not None
    assert sorted(e.id for e in again.outputs) == sorted(e.id for e in first.outputs)
    timer.ack(again)
    assert timer.fire() is None


def test_window_ids_depend_on_pipeline_step_key_and_window_only(store: str | None) -> None:
    ids = []
    for _ in range(2):
        runner, step = make(store, window={"tumbling": {"size_s": 60}})
        step.program.pipeline = "same"  # what the ids are made of; the state stays apart
        runner.run([ev("a", T0 + 1000), ev("a", T0 + 3000)])
        ids.append([e.id for e in close_all(step)])
    assert ids[0] == ids[1] and len(ids[0]) == 1


def test_idle_windows_close_by_the_wall_clock(store: str | None) -> None:
    runner, step = make(store, window={"tumbling": {"size_s": 10}}, time="processing")
    base = T0
    step.now = lambda: base  # type: ignore[method-assign]
    runner.run([ev("a", 0), ev("a", 0)])
    timer = step.timers()[0]
    assert timer.fire() is None
    step.now = lambda: base + 10_000  # type: ignore[method-assign]
    fired = timer.fire()
    assert fired is not None and [e.data["n"] for e in fired.outputs] == [2]
    timer.ack(fired)
    assert step.stats()["open_windows"] == 0


def test_event_time_watermark_advances_with_the_wall_clock_when_idle(store: str | None) -> None:
    runner, step = make(
        store, window={"tumbling": {"size_s": 60}}, allowed_lateness_s=5, idle_timeout_s=2
    )
    step.now = lambda: 5_000_000  # type: ignore[method-assign]
    runner.run([ev("a", T0 + 50_000)])
    timer = step.timers()[0]
    step.now = lambda: 5_000_000 + 16_000  # type: ignore[method-assign]
    assert timer.fire() is None  # watermark T0 + 50 s + (16 - 2) s < end + lateness
    step.now = lambda: 5_000_000 + 17_000  # type: ignore[method-assign]
    fired = timer.fire()
    assert fired is not None and len(fired.outputs) == 1
    # the clock's watermark judges lateness too: an event for the closed window is late
    (late,) = runner.run([ev("a", T0 + 59_000)])
    assert isinstance(late, Failure) and late.error_type == "AggregateLateEventError"


def test_a_backlog_read_slower_than_real_time_closes_windows_by_event_time_only(
    store: str | None,
) -> None:
    # Batches of a backlog come less than idle_timeout_s apart, each moving the watermark a
    # little: the clock must not close a window its next events still belong to.
    runner, step = make(store, window={"tumbling": {"size_s": 1}}, idle_timeout_s=5)
    timer = step.timers()[0]
    closed = []
    for b in range(40):  # 40 batches 400 ms apart (wall), 100 ms of event time each
        step.now = lambda b=b: 5_000_000 + 400 * b  # type: ignore[method-assign]
        outs = runner.run([ev("a", T0 + 100 * b + 50, i=b)])
        assert outs == [[]], f"batch {b}: {outs}"
        fired = timer.fire()
        if fired is not None:
            closed += fired.outputs
            timer.ack(fired)
    assert len(closed) == 3  # by event time: the fourth window's end is not reached
    assert [e.data["n"] for e in closed + close_all(step)] == [10, 10, 10, 10]


def test_all_aggregations_and_reducers(store: str | None) -> None:
    runner, step = make(
        store,
        window={"tumbling": {"size_s": 60}},
        aggregations={
            "n": "count",
            "total": {"sum": "double(data.amount)"},
            "low": {"min": "data.amount"},
            "high": {"max": "data.amount"},
            "mean": {"avg": "data.amount"},
            "first": {"first": "data.item"},
            "last": {"last": "data.item"},
            "items": {"collect": "data.item", "max": 3},
            "users": {"distinct": "data.buyer"},
            "plus": {"init": "0", "add": "acc + data.amount", "merge": "acc + other"},
            "names": {"init": "''", "add": "acc + data.item"},
        },
    )
    t = [T0 + s * 1000 for s in (5, 1, 9, 3, 7)]
    items = ["c", "a", "e", "b", "d"]
    batch = [
        ev("k", tt, amt, item=it, buyer=f"b{amt % 2}")
        for tt, amt, it in zip(t, [5, 1, 9, 3, 7], items)
    ]
    runner.run(batch[:2])
    runner.run(batch[2:])
    (w,) = by_window(close_all(step)).values()
    assert w["n"] == 5 and w["total"] == 25 and w["low"] == 1 and w["high"] == 9
    assert w["mean"] == 5
    assert w["first"] == "a" and w["last"] == "e"  # by event time
    assert w["items"] == ["c", "a", "e"] and step.stats()["collect_truncated"] == 2
    assert w["users"] == 1  # every amount is odd
    assert w["plus"] == 25 and w["names"] == "caebd"


def test_reducer_failure_fails_only_its_event(store: str | None) -> None:
    runner, step = make(
        store,
        window={"tumbling": {"size_s": 60}},
        aggregations={
            "n": "count",
            "s": {"init": "0", "add": "acc + data.amount", "merge": "acc + other"},
        },
    )
    out = runner.run([ev("k", T0, 1), ev("k", T0, "x"), ev("k", T0, 2)])  # type: ignore[arg-type]
    assert isinstance(out[1], Failure) and "add 'acc + data.amount' failed" in out[1].message
    (w,) = by_window(close_all(step)).values()
    assert w == {"window_end": iso(T0 + 60_000), "n": 2, "s": 3}


def test_emit_update_sends_the_window_after_each_batch(store: str | None) -> None:
    runner, step = make(store, window={"tumbling": {"size_s": 60}}, emit="update")
    out1 = runner.run([ev("a", T0), ev("a", T0 + 1)])
    out2 = runner.run([ev("a", T0 + 2)])
    assert out1[0] == [] and [e.data["n"] for e in out1[1]] == [2]
    assert [e.data["n"] for e in out2[0]] == [3]
    assert out1[1][0].id != out2[0][0].id
    (final,) = close_all(step)
    assert final.data["n"] == 3 and final.id not in (out1[1][0].id, out2[0][0].id)


def test_an_event_without_time_or_with_a_bad_value_fails_alone(store: str | None) -> None:
    runner, _ = make(store, window={"tumbling": {"size_s": 60}})
    no_time = CloudEvent(
        {"specversion": "1.0", "id": "x", "source": "/s", "type": "t"}, {"user": "a", "amount": 1}
    )
    out = runner.run([no_time, ev("a", T0, float("nan")), ev("a", T0)])  # type: ignore[list-item]
    assert isinstance(out[0], Failure) and "use time: processing" in out[0].message
    assert isinstance(out[1], Failure) and "needs a finite number" in out[1].message
    assert out[2] == []


@pytest.mark.parametrize(
    ("agg", "expect"),
    [
        ({"window": {}}, "window needs exactly one of tumbling, hopping, session; got none"),
        (
            {"window": {"hopping": {"size_s": 10, "advance_s": 20}}},
            "hopping advance_s (20) is larger than size_s (10)",
        ),
        ({"aggregations": {"n": "cnt"}}, "an aggregation is 'count', {OP: CEL}"),
        ({"aggregations": {"n": {"sum": "x", "max": "y"}}}, "got sum, max: split them"),
        ({"aggregations": {"key": "count"}}, "aggregation name 'key' is taken"),
        ({"aggregations": {}}, "at least 1 item"),
        ({"allowed_lateness_s": -1}, "greater than or equal to 0"),
    ],
)
def test_bad_configs_name_the_field_and_the_fix(agg: dict[str, Any], expect: str) -> None:
    raw = {
        "key": "data.user",
        "window": {"tumbling": {"size_s": 60}},
        "aggregations": {"n": "count"},
    }
    with pytest.raises(ValidationError, match=re.escape(expect)):
        AggregateConfig.model_validate(raw | agg)


@pytest.mark.parametrize(
    ("aggregations", "expect"),
    [
        ({"s": {"init": "data.x", "add": "acc"}}, "init 'data.x' uses 'data'; init is a constant"),
        (
            {"s": {"init": "0", "add": "acc", "merge": "acc + data"}},
            "merge sees only 'acc' and 'other'",
        ),
        (
            {"s": {"sum": "dta.amount"}},
            "aggregation 's' (sum: 'dta.amount'): unknown variable 'dta'",
        ),
    ],
)
def test_bad_expressions_name_the_aggregation(aggregations: dict[str, Any], expect: str) -> None:
    with pytest.raises(cel.CELError, match=re.escape(expect)):
        make(None, window={"tumbling": {"size_s": 60}}, aggregations=aggregations)


def make_deduped(store: str | None, **agg: Any) -> tuple[PipelineRunner, AggregateStep]:
    runner, step = make(store, {"dedupe": {"window_s": 600}}, **agg)
    assert step.dedupe_ms == 600_000
    return runner, step


@pytest.mark.parametrize("window", [{"tumbling": {"size_s": 60}}, {"session": {"gap_s": 30}}])
def test_dedupe_a_replayed_batch_is_not_counted_twice(
    store: str | None, window: dict[str, Any]
) -> None:
    # A crash between the state update and the offset commit: the same events come again, in
    # batches cut differently (2,500 events: past the scripts' 1,000-digest chunks).
    runner, step = make_deduped(store, window=window)
    rnd = random.Random(7)
    evs = [
        ev(f"u{rnd.randrange(40)}", T0 + rnd.randrange(50_000), rnd.randrange(100), i)
        for i in range(2500)
    ]
    runner.run(evs[:1200])
    runner.run(evs[:300])  # replay: all applied before
    runner.run(evs[900:2500])  # replay overlapping new events
    runner.run(evs[2400:])
    expect: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in evs:
        expect[e.data["user"]][0] += 1
        expect[e.data["user"]][1] += e.data["amount"]
    got: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in close_all(step):
        got[e.data["key"]][0] += e.data["n"]
        got[e.data["key"]][1] += e.data["total"]
    assert got == expect
    assert step.counters["duplicate_events"] == 300 + 300 + 100
    assert step.stats()["applied_ids"] == 2500


def test_dedupe_does_not_remember_late_events(store: str | None) -> None:
    # a late event is dead-lettered, not applied: replayed, it is dead-lettered again
    runner, step = make_deduped(store, window={"tumbling": {"size_s": 60}})
    runner.run([ev("a", T0 + 200_000, i=1)])
    late = ev("a", T0 + 1000, i=2)
    for _ in range(2):
        (out,) = runner.run([late])
        assert isinstance(out, Failure) and out.error_type == "AggregateLateEventError"
    assert step.counters["late_events"] == 2 and step.counters["duplicate_events"] == 0


def test_without_dedupe_a_replay_counts_twice(store: str | None) -> None:
    # what delivery.dedupe prevents (and the proof the test above could fail)
    runner, step = make(store, window={"tumbling": {"size_s": 60}})
    e = ev("a", T0 + 1000, i=1)
    runner.run([e])
    runner.run([e])
    (out,) = close_all(step)
    assert out.data["n"] == 2


def test_windows_closed_by_the_timer_run_through_the_later_steps() -> None:
    from eventbus.serving._outputs import _followed

    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": f"a{uuid.uuid4().hex[:10]}"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [
                {"id": "first", "convert": {"set": {"data.seen": "1"}}},
                {
                    "id": "per_user",
                    "aggregate": {
                        "key": "data.user",
                        "window": {"tumbling": {"size_s": 60}},
                        "aggregations": {"n": "count"},
                    },
                },
                {"id": "big", "filter": "data.n > 1"},
                {"id": "ratio", "convert": {"set": {"data.r": "10 / (data.n - 2)"}}},
            ],
            "sink": {"kafka": {"topic": "out"}},
        },
    }
    runner = PipelineRunner(PipelineConfig.model_validate(doc))
    evs = [ev(u, T0 + 1000 * i, i=i) for i, u in enumerate("aabbb")] + [ev("c", T0 + 70_000)]
    runner.run(evs)
    (timer,) = runner.timers()
    assert timer.step_index == 1
    fired = timer.fire()
    assert fired is not None and len(fired.outputs) == 2  # a: 2 events, b: 3
    outputs, dead = _followed("p", fired.outputs, runner.run_after(timer.step_index, fired.outputs))
    assert [(e.data["key"], e.data["r"]) for e in outputs] == [("b", 10)]
    (d,) = dead  # a: 10 / 0 fails in the step after the filter: a dead letter with the reason
    assert d.data["key"] == "a" and d["ebstep"] == "ratio" and d["ebpipeline"] == "p"
    assert runner.counters[2].filtered == 0 and runner.counters[3].errors == 1
    # the six inputs are absorbed into windows (not filtered); two windows emitted, one output
    per_user = runner.counters[1]
    assert (per_user.events_in, per_user.events_out, per_user.absorbed) == (6, 0, 6)
    assert (per_user.filtered, per_user.emitted) == (0, 2) and runner.timer_outputs == 1


@pytest.mark.redis
def test_dedupe_two_replicas_applying_the_same_events_at_once_count_them_once(
    redis_url: str,
) -> None:
    # a rebalance: two consumers of one partition run overlapping batches at the same time
    import threading

    config = AggregateConfig.model_validate(
        {
            "key": "data.user",
            "window": {"tumbling": {"size_s": 60}},
            "aggregations": {"n": "count", "total": {"sum": "data.amount"}},
        }
    )
    name = f"a{uuid.uuid4().hex[:10]}"
    a, b = (
        AggregateStep("per_user", config, pipeline=name, redis_url=redis_url, dedupe_window_s=60)
        for _ in range(2)
    )
    evs = [ev(f"u{i % 7}", T0 + i * 10, i % 13, i) for i in range(3000)]
    go = threading.Barrier(2)

    def replay(step: AggregateStep, cut: int) -> None:
        go.wait()
        for base in range(0, len(evs), cut):
            step.process(evs[base : base + cut])

    threads = [threading.Thread(target=replay, args=(s, c)) for s, c in ((a, 500), (b, 700))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got = {e.data["key"]: (e.data["n"], e.data["total"]) for e in a.flush()}
    expect: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in evs:
        expect[e.data["user"]][0] += 1
        expect[e.data["user"]][1] += e.data["amount"]
    assert got == {k: tuple(v) for k, v in expect.items()}
    assert a.counters["duplicate_events"] + b.counters["duplicate_events"] == 3000


def test_a_key_with_a_nul_character_fails_alone(store: str | None) -> None:
    runner, step = make(store, window={"tumbling": {"size_s": 60}})
    bad, good = ev("a\x00b", T0 + 1000), ev("a", T0 + 2000)
    out = runner.run([bad, good])
    assert isinstance(out[0], Failure) and "NUL character" in out[0].message and out[1] == []
    assert [(e.data["key"], e.data["n"]) for e in close_all(step)] == [("a", 1)]
