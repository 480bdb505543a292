"""An aggregate step wakes its timer once a batch moved the watermark past a window's close
deadline, so the window is emitted then rather than at the timer's next tick."""

from __future__ import annotations

from typing import Any

import pytest

from eventbus.pipelines.steps._aggregate import AggregateStep
from eventbus.pipelines.steps._aggregate_timer import AggregateTimer
from tests.unit.pipelines.test_aggregate import T0, ev, make


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest) -> str | None:
    return None if request.param == "memory" else request.getfixturevalue("redis_url")


def woken(store: str | None, **agg: Any) -> tuple[AggregateStep, AggregateTimer, list[int]]:
    _, step = make(store, window={"tumbling": {"size_s": 1}}, idle_timeout_s=600, **agg)
    timer = AggregateTimer(step)
    calls: list[int] = []
    timer.wake_with(lambda: calls.append(1))
    return step, timer, calls


def test_a_batch_past_a_windows_end_wakes_the_timer_once_and_the_window_is_due(
    store: str | None,
) -> None:
    step, timer, calls = woken(store)
    step.process([ev("a", T0 + 10), ev("b", T0 + 900)])
    assert calls == []
    assert timer.close(now=0).outputs == []  # nothing due yet: a wake would have been early
    step.process([ev("a", T0 + 999), ev("a", T0 + 1000)])
    assert calls == [1]
    closed = {(e.data["key"], e.data["n"]) for e in timer.close(now=0).outputs}
    assert closed == {("a", 2), ("b", 1)}  # what the wake announced is there to close
    step.process([ev("b", T0 + 1500)])
    assert calls == [1]  # the next window is not due yet
    step.process([ev("b", T0 + 2000)])
    assert calls == [1, 1]


def test_allowed_lateness_delays_the_wake_to_the_close_deadline(store: str | None) -> None:
    step, timer, calls = woken(store, allowed_lateness_s=2)
    step.process([ev("a", T0 + 10), ev("a", T0 + 2500)])
    assert calls == []  # the first window closes at its end + 2 s
    step.process([ev("a", T0 + 2999)])
    assert calls == []
    step.process([ev("a", T0 + 3000)])
    assert calls == [1]
    assert [e.data["n"] for e in timer.close(now=0).outputs] == [1]


def test_late_events_and_processing_time_do_not_wake_the_timer(store: str | None) -> None:
    step, _, calls = woken(store)
    step.process([ev("a", T0 + 5000)])
    results = step.process([ev("a", T0 + 10)])
    assert results[0].error_type == "AggregateLateEventError"
    assert calls == []  # a late event's window is not open: nothing came due
    step, _, calls = woken(store, time="processing")
    step.process([ev("a", T0), ev("a", T0 + 5000)])
    assert calls == []  # the clock closes processing-time windows, on the timer's tick
