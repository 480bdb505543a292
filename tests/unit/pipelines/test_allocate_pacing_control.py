"""The pacing plan's spend-vs-plan correction (``pacing.gain``) and the forecast's robustness to a
traffic spike (issue #44, part 3)."""

from __future__ import annotations

import math

import pytest
import torch

from eventbus.pipelines.steps._allocate_feedback import DecisionLedger
from eventbus.pipelines.steps._allocate_pacing import PacingPlan, TrafficForecast, winsorised
from eventbus.pipelines.steps._allocate_pacing_config import PacingConfig

DAY = 48


def paced_day(gain: float, shortfall: float) -> tuple[float, list[float], float]:
    """A day of one budget whose duals are priced too high: an interval spends ``shortfall`` of
    its allowance times the correction (what a lower dual would let through), never past its cap.
    The fraction of the budget spent, the corrections, and the most the spend went past a cap."""
    plan = PacingPlan(
        PacingConfig(intervals_per_day=DAY, forecast="flat", gain=gain),
        torch.ones(1, 1, dtype=torch.float64),
    )
    budget = torch.tensor([100.0], dtype=torch.float64)
    used = torch.zeros(1, dtype=torch.float64)
    corrections, over = [], 0.0
    for t in range(DAY):
        plan.forecast.observe(t, [0] * 10)  # flat traffic
        plan.roll(t, used, budget)
        corrections.append(float(plan.correction[0]))
        want = plan.allowance * shortfall * plan.correction
        spent = torch.minimum(want, plan.caps - used).clamp_min(0.0)
        used = used + spent
        over = max(over, float((used - plan.caps).max()), float((used - budget).max()))
    return float(used[0] / budget[0]), corrections, over


def test_the_controller_spends_a_budget_the_duals_price_too_high() -> None:
    without, flat, _ = paced_day(gain=0.0, shortfall=0.7)
    with_pi, corrections, over = paced_day(gain=0.5, shortfall=0.7)
    assert flat == [1.0] * DAY  # off: no correction
    # the plain plan spreads what is left over fewer intervals and catches up only in the last
    # (which may take all of it); the controller keeps on plan through the day
    assert with_pi >= 0.98
    assert over <= 1e-9  # never past an interval's cap or the budget
    # it converges: the correction settles near 1 / 0.7 and stays within its bounds
    assert corrections[-2] == pytest.approx(1 / 0.7, rel=0.15)
    assert all(0.25 <= c <= 4.0 for c in corrections)
    assert without < 0.98 <= with_pi, (without, with_pi)


def test_the_controller_holds_back_an_overspending_day() -> None:
    used, corrections, over = paced_day(gain=0.5, shortfall=1.5)
    assert over <= 1e-9
    assert min(corrections) < 0.85  # spending ahead of plan lowers the re-solve's budget
    assert used == pytest.approx(1.0, abs=0.02)


def test_a_spike_does_not_inflate_the_forecast_after_it() -> None:
    season = 24
    curve = [100 + 60 * math.sin(2 * math.pi * h / season) for h in range(season)]
    f = TrafficForecast(PacingConfig(intervals_per_day=season), 1)
    for i in range(2 * season):
        f.observe(i, [0] * round(curve[i % season]))
    start = 2 * season
    for h in range(8):  # the third day to 08:00, with a 5x spike at 05:00 and 06:00
        v = curve[h] * (5 if h in (5, 6) else 1)
        f.observe(start + h, [0] * round(v))
    after = f.remaining(start + 8)[0]
    for r, h in enumerate(range(8, season)):
        assert after[r].item() <= 1.25 * curve[h], (h, after[r].item(), curve[h])


def test_a_shift_that_lasts_passes_the_outlier_filter() -> None:
    season = 12
    history = [100.0] * (2 * season) + [250.0] * 6  # the traffic is 2.5x from here on
    robust = winsorised(history, season)
    assert robust[: 2 * season] == history[: 2 * season]
    assert robust[2 * season : 2 * season + 2] == [100.0, 100.0]  # a burst, until it lasts
    assert robust[2 * season + 2 :] == [250.0] * 4  # the median has moved: the new level
    # hostile: zeros and a lone huge interval
    odd = winsorised([0.0] * season + [0.0, 1e12, 0.0], season)
    assert odd[season + 1] == 1.0  # replaced by the expectation (a period before, at least 1)
    assert all(math.isfinite(v) for v in odd)


def test_the_memory_ledger_expires_exactly_the_due_decisions() -> None:
    ledger = DecisionLedger("coupon", "day", None)
    for t in range(1000):
        ledger.add([(f"d{t}", f"r{t}")], float(t))
    ledger.add([("d3", "again")], 2000.0)  # decided again: due at its new time
    assert ledger.take(["d5", "nope"]) == ["r5", None]
    due = ledger.expired(10.0)
    assert due == [f"r{t}" for t in range(10) if t not in (3, 5)]
    assert ledger.expired(10.0) == []
    assert len(ledger.expired(2000.5, limit=100)) == 100  # at most the limit per call
    assert ledger.expired(2000.5) == [f"r{t}" for t in range(110, 1000)] + ["again"]
    assert ledger.pending() == 0
