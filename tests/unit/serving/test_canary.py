"""Canary judgement and routing shares (no Ray, no Redis)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from eventbus import CloudEvent
from eventbus.serving._canary import bucket, judge, sum_figures


def figures(
    s_events: float,
    s_failed: float,
    s_seconds: float,
    c_events: float,
    c_failed: float,
    c_seconds: float,
) -> dict[str, dict[str, float]]:
    return {
        "stable": {"events": s_events, "failed": s_failed, "seconds": s_seconds},
        "canary": {"events": c_events, "failed": c_failed, "seconds": c_seconds},
    }


def test_a_healthy_canary_advances_only_after_the_step_and_enough_events() -> None:
    ok = figures(900, 9, 0.09, 100, 1, 0.01)
    assert judge(ok, elapsed_s=5, step_s=30).action == "wait"
    assert judge(ok, elapsed_s=31, step_s=30).action == "advance"
    few = figures(900, 0, 0.09, 5, 0, 0.0005)
    verdict = judge(few, elapsed_s=31, step_s=30)
    assert verdict.action == "wait" and "needs 20" in verdict.reason


@pytest.mark.parametrize(
    ("fig", "why"),
    [
        (figures(900, 0, 0.09, 100, 5, 0.01), "error rate 5.0%"),  # 5% against 0%
        (figures(900, 90, 0.09, 100, 25, 0.01), "error rate 25.0%"),  # 25% against 10%
        (figures(900, 0, 0.09, 100, 0, 0.1), "ms per event"),  # 10x slower steps
    ],
)
def test_a_regression_rolls_back_at_once_even_mid_step(
    fig: dict[str, dict[str, float]], why: str
) -> None:
    verdict = judge(fig, elapsed_s=1, step_s=30)
    assert verdict.action == "rollback" and why in verdict.reason


def test_noise_is_not_a_regression() -> None:
    # 1.5% against 1% errors (within +1 point), and microsecond steps 1.4x slower (under the 50 us floor)
    assert (
        judge(figures(1000, 10, 0.001, 200, 3, 0.00028), elapsed_s=31, step_s=30).action
        == "advance"
    )


def test_shares_follow_the_weight_and_an_entity_stays_on_one_version() -> None:
    events = [CloudEvent.create(type="t", source="/s", id=f"e{i}") for i in range(20_000)]
    buckets = Counter(bucket(e) for e in events)
    assert set(buckets) == set(range(100))
    share = sum(1 for e in events if bucket(e) < 10) / len(events)
    assert 0.085 < share < 0.115
    keyed = [
        CloudEvent.create(type="t", source="/s", id=f"x{i}", partitionkey="customer-7")
        for i in range(50)
    ]
    assert len({bucket(e) for e in keyed}) == 1


def test_figures_sum_fresh_replicas_of_the_same_canary_only() -> None:
    entry = {
        "at": 1000.0,
        "canary_id": "abc",
        "stable": {"events": 10, "failed": 1, "seconds": 0.5},
        "canary": {"events": 2, "failed": 0, "seconds": 0.1},
    }
    raw = {
        "r1": json.dumps(entry),
        "r2": json.dumps({**entry, "at": 999.0}),
        "old": json.dumps({**entry, "at": 900.0}),  # a replica that went away
        "other": json.dumps({**entry, "canary_id": "zzz"}),  # a previous canary's figures
    }
    total = sum_figures(raw, "abc", now=1001.0)
    assert total["stable"] == {"events": 20, "failed": 2, "seconds": 1.0}
    assert total["canary"]["events"] == 4
