"""The aggregate step's fast paths (one activation for data-only expressions, the usual time
text parsed inline, tumbling windows folded in one pass, the scripts' compact replies) give
what the general ones do, on the in-memory state and on the Redis scripts."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest
import redis

from eventbus._internal import keys
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from tests.unit.pipelines.test_aggregate import (
    T0,
    by_window,
    close_all,
    ev,
    iso,
    make,
    make_deduped,
    store,
)

__all__ = ["store"]  # the fixture, shared with test_aggregate


def test_emit_update_skips_the_late_items_of_a_batch(store: str | None) -> None:
    # the script answers the late flags as one string and the merged windows' values only:
    # each update goes to its own window's last event, none to a late one
    runner, _ = make(store, window={"tumbling": {"size_s": 60}}, emit="update")
    runner.run([ev("a", T0 + 120_000)])
    out = runner.run([ev("b", T0), ev("a", T0 + 121_000), ev("c", T0 + 1), ev("c", T0 + 125_000)])
    assert isinstance(out[0], Failure) and "is late for key 'b'" in out[0].message
    assert [(e.data["key"], e.data["n"]) for e in out[1]] == [("a", 2)]
    assert isinstance(out[2], Failure) and "is late for key 'c'" in out[2].message
    assert [(e.data["key"], e.data["n"]) for e in out[3]] == [("c", 1)]


@pytest.mark.parametrize(
    "time",
    [
        lambda ms: iso(ms),  # the usual text: the fast path
        lambda ms: iso(ms).replace("Z", "+00:00"),  # an offset: parsed in full
        lambda ms: iso(ms + 3_600_000).replace("Z", "+01:00"),
    ],
    ids=["utc-z", "utc-offset", "plus-one-hour"],
)
def test_every_time_spelling_lands_in_the_same_window(store: str | None, time: Any) -> None:
    runner, step = make(store, window={"tumbling": {"size_s": 1}})
    rng = random.Random(7)
    events, expect = [], defaultdict(lambda: [0, 0])
    for i in range(300):
        ms = T0 + rng.randrange(0, 3000)
        amount = rng.randrange(100)
        events.append(
            CloudEvent.create(
                type="t",
                source="/s",
                id=f"e{i}",
                time=time(ms),
                data={"user": "u", "amount": amount},
            )
        )
        w = expect[iso(ms - ms % 1000)]
        w[0] += 1
        w[1] += amount
    events.sort(key=lambda e: e.attributes["time"])  # in time order: none late
    assert all(o == [] for o in runner.run(events))
    got = {start: [w["n"], w["total"]] for (_, start), w in by_window(close_all(step)).items()}
    assert got == dict(expect)


def test_values_of_each_type_pass_or_fail_as_the_general_check_says(store: str | None) -> None:
    runner, step = make(
        store,
        window={"tumbling": {"size_s": 60}},
        aggregations={"n": "count", "total": {"sum": "data.amount"}, "all": {"collect": "data.v"}},
    )
    values: list[tuple[Any, Any]] = [(1, "x"), (2.5, {"a": [1]}), (True, 1), ("3", 2), (None, None)]
    out = runner.run([ev("k", T0 + i, amount, v=v) for i, (amount, v) in enumerate(values)])
    assert out[0] == [] and out[1] == [] and out[4] == []
    for i in (2, 3):
        assert (
            isinstance(out[i], Failure) and "'total' (sum) needs a finite number" in out[i].message
        )
    (w,) = by_window(close_all(step)).values()
    assert (w["n"], w["total"], w["all"]) == (3, 3.5, ["x", {"a": [1]}])


def test_integer_keys_and_non_data_expressions_keep_their_own_activation(
    store: str | None,
) -> None:
    runner, step = make(
        store,
        window={"tumbling": {"size_s": 60}},
        key="data.id",
        aggregations={"n": "count", "kinds": {"collect": "type + ':' + subject"}},
    )
    events = [
        CloudEvent.create(
            type="t", source="/s", time=iso(T0 + i), subject=f"s{i}", data={"id": i % 2}
        )
        for i in range(4)
    ]
    assert runner.run(events) == [[], [], [], []]
    got = {k: (w["n"], w["kinds"]) for (k, _), w in by_window(close_all(step)).items()}
    assert got == {"0": (2, ["t:s0", "t:s2"]), "1": (2, ["t:s1", "t:s3"])}


@pytest.mark.redis
def test_a_window_written_by_the_previous_script_version(redis_url: str) -> None:
    # the previous scripts wrote the same fields (the window's end each batch, not once): a
    # window they opened is merged on, and its due entry kept
    runner, step = make(redis_url, window={"tumbling": {"size_s": 60}})
    w, due = keys.aggregate_keys(step.pipeline, step.id)[:2]
    wid = f"{T0}:a"
    r = redis.Redis.from_url(redis_url)
    r.hset(
        w, mapping={f"{wid}\0c": 3, f"{wid}\x001": 3, f"{wid}\x002": 6, f"{wid}\0e": T0 + 60_000}
    )
    r.zadd(due, {wid: T0 + 60_000})
    runner.run([ev("a", T0 + 5, 4), ev("b", T0 + 6, 1)])
    got = {k: (w["n"], w["total"]) for (k, _), w in by_window(close_all(step)).items()}
    assert got == {"a": (4, 10), "b": (1, 1)}
    assert r.hlen(w) == 0 and r.zcard(due) == 0  # every field and entry dropped with it


def test_sums_of_integers_and_fractions_across_batches(store: str | None) -> None:
    # the script adds integers with HINCRBY while the field holds one, then HINCRBYFLOAT (a
    # fraction, or past int64); avg's sum too
    runner, step = make(
        store,
        window={"tumbling": {"size_s": 60}},
        aggregations={"total": {"sum": "data.amount"}, "mean": {"avg": "data.amount"}},
    )
    batches: dict[str, list[list[Any]]] = {
        "ints": [[1, 2], [3], [-10]],
        "then-fraction": [[1, 2], [2.5], [3]],
        "fraction-first": [[0.25], [1], [2, 3]],
        "past-int64": [[2**62, 2**62], [2**62], [1]],
    }
    for k, (batch_list) in enumerate(batches.values()):
        for b in batch_list:
            assert all(o == [] for o in runner.run([ev(str(k), T0 + 1, x) for x in b]))
    got = {key: (w["total"], w["mean"]) for (key, _), w in by_window(close_all(step)).items()}
    for k, batch_list in enumerate(batches.values()):
        flat = [x for b in batch_list for x in b]
        total, mean = got[str(k)]
        assert total == pytest.approx(sum(flat), rel=1e-15)
        assert mean == pytest.approx(sum(flat) / len(flat), rel=1e-15)
    assert got["0"][0] == -4 and isinstance(got["0"][0], int)  # integers stay integers


def test_keys_and_values_of_any_text_round_trip_through_the_script(store: str | None) -> None:
    # the items reach the script as one JSON array: quotes, backslashes, newlines, non-ASCII
    # and digits-only keys come back as they were
    texts = ['a"b', "c\\d", "e\nf", "ü", "😀", "123", "", " ", "\\u0041", "x\ty"]
    runner, step = make(
        store,
        window={"tumbling": {"size_s": 60}},
        aggregations={"n": "count", "vals": {"collect": "data.v"}, "first": {"first": "data.v"}},
    )
    out = runner.run([ev(t, T0 + i, v=t + "!") for i, t in enumerate(texts)])
    assert out == [[]] * len(texts)
    got = {k: (w["n"], w["vals"], w["first"]) for (k, _), w in by_window(close_all(step)).items()}
    assert got == {t: (1, [t + "!"], t + "!") for t in texts}


def test_dedupe_remembers_the_events_of_merged_items_only(store: str | None) -> None:
    # one batch with a late event, an on-time one and a hopping event late for one of its
    # windows and on time for the other: replayed, the applied ones are duplicates and the
    # late one is dead-lettered again
    runner, step = make_deduped(store, window={"hopping": {"size_s": 60, "advance_s": 30}})
    runner.run([ev("a", T0 + 100_000, i=1)])  # the watermark: T0 + 100 s
    batch = [ev("a", T0 + 10_000, i=2), ev("a", T0 + 75_000, i=3), ev("b", T0 + 110_000, i=4)]
    for replay in (False, True):
        out = runner.run(batch)
        assert isinstance(out[0], Failure) and out[0].error_type == "AggregateLateEventError"
        assert out[1] == [] and out[2] == []
        assert step.counters["duplicate_events"] == (2 if replay else 0)
    got = {(k, s): w["n"] for (k, s), w in by_window(close_all(step)).items()}
    assert got == {
        ("a", iso(T0 + 60_000)): 2,  # 75 s and 100 s, once each
        ("a", iso(T0 + 90_000)): 1,
        ("b", iso(T0 + 60_000)): 1,
        ("b", iso(T0 + 90_000)): 1,
    }
    assert step.counters["late_events"] == 2


def test_thousands_of_windows_claimed_again_after_a_lapsed_lease_then_dropped(
    store: str | None,
) -> None:
    # the claim and ack scripts take windows off the due set, lease and drop them in chunks of
    # 1,000 arguments: 2,500 windows cross the chunks' bounds, first from the due set, then
    # again from the claim set once the first claim's lease lapsed (a timer that died)
    from eventbus.pipelines.steps._aggregate_timer import AggregateTimer

    runner, step = make(store, window={"tumbling": {"size_s": 60}})
    n = 2_500
    runner.run([ev(f"u{i}", T0 + i % 50, i % 7) for i in range(n)] + [ev("x", T0 + 61_000, 1)])
    timer = AggregateTimer(step, lease_s=10)
    later = T0 + 10 * 60_000
    first = timer.close(now=later)  # never acked
    assert len(first.token) == n and not first.more
    again = timer.close(now=later + 5_000)  # the lease holds: nothing
    assert again.token == []
    retry = timer.close(now=later + 11_000)
    assert sorted(retry.token) == sorted(first.token)
    got = {k: (w["n"], w["total"]) for (k, _), w in by_window(retry.outputs).items()}
    assert got == {f"u{i}": (1, i % 7) for i in range(n)}
    timer.ack(retry)
    assert timer.close(now=later + 30_000).token == []
    if store is not None:  # every field and entry of the dropped windows is gone
        w, due, claim = keys.aggregate_keys(step.pipeline, step.id)[:3]
        r = redis.Redis.from_url(store)
        assert r.zcard(claim) == 0 and r.zrange(due, 0, -1) == [f"{T0 + 60_000}:x".encode()]
        fields = {f.split(b"\0")[0] for f in r.hkeys(w)}
        assert fields <= {b"wm", b"wmw", b"wmc", f"{T0 + 60_000}:x".encode()}


@pytest.mark.parametrize(
    "aggregations",
    [
        {"n": "count", "total": {"sum": "data.amount"}},
        {"total": {"sum": "data.amount"}, "n": "count", "again": {"sum": "data.v"}},
        {"only": {"sum": "data.amount"}},
    ],
    ids=["count-sum", "sum-count-sum", "sum"],
)
def test_the_one_pass_fold_of_counts_and_sums_gives_the_general_items(
    aggregations: dict[str, Any],
) -> None:
    # tumbling windows of counts and sums only are folded in one pass (sums_only): the same
    # items, partials and failures as the general windows + partials path, on ints, floats,
    # nulls (left out of a sum), big integers, out-of-order times and bad values
    rng = random.Random(5)
    values: list[Any] = [1, 2.5, None, -3, 2**62, 0.1, 7, "x"]
    events = [
        ev(
            f"k{rng.randrange(5)}",
            T0 + rng.randrange(0, 300_000),
            rng.choice(values),
            i,
            v=rng.choice(values),
        )
        for i in range(400)
    ]
    got = []
    for fast in (True, False):
        _, step = make(
            None,
            window={"tumbling": {"size_s": 60}},
            aggregations=aggregations,
            allowed_lateness_s=300,
        )
        assert step.program.sums_only
        step.program.sums_only = fast
        seen: list[Any] = []
        step.state.add = lambda now, items, seen_=None, out=seen: (  # type: ignore[method-assign]
            out.extend(
                (i.key, i.start, i.end, i.max_t, i.count, i.partials, i.events) for i in items
            )
            or ([False] * len(items), [None] * len(items), [])
        )
        results = step.process(events)
        got.append((sorted(seen), [getattr(r, "message", r) for r in results]))
    assert got[0] == got[1]
    assert len(got[0][0]) > 20 and any(isinstance(r, str) for r in got[0][1])
