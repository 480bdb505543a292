"""The allocate step's pacing loop on in-memory state: the traffic forecast, the paced caps,
consumption feedback that lags the decisions, calibration, hostile feedback, config errors;
and the decision ledger on a real Redis."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus.errors import PipelineConfigError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner
from eventbus.pipelines.steps._allocate_pacing import TrafficForecast
from eventbus.pipelines.steps._allocate_pacing_config import PacingConfig
from eventbus.solver import AllocationProblem, FactorisedConsumption, save_problem

#: a day of 12 intervals: requests per interval (a diurnal curve, peak at 6-7)
SHAPE = [20, 10, 10, 20, 40, 60, 80, 80, 60, 40, 30, 30]
DAY = len(SHAPE)
BUDGET = 120.0


@pytest.fixture
def catalogue(tmp_path: Path) -> Path:
    # one money budget counting expected spend: item costs 1 and 2 x the redemption rate;
    # two segments, both under the budget
    cons = FactorisedConsumption(
        torch.tensor([[1.0, 2.0]]),
        torch.ones(1, 2),
        torch.zeros(1, dtype=torch.long),
        weights={"redeem": torch.ones(1, 2)},
        row_weight=("redeem",),
    )
    save_problem(
        AllocationProblem(torch.ones(1, 2), torch.tensor([BUDGET]), cons),
        tmp_path / "catalogue.npz",
    )
    return tmp_path / "catalogue.npz"


def runner(
    catalogue: Path, name: str = "coupons", redis_url: str | None = None, **spec: Any
) -> PipelineRunner:
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}, {"kafka": {"topic": "redemptions"}}],
            "steps": [
                {
                    "id": "coupon",
                    "allocate": {
                        "catalogue": catalogue.name,
                        "revenue": "data.scores",
                        "segment": "data.segment",
                        "weights": {"redeem": "data.redeem"},
                        **spec,
                    },
                }
            ],
            "sink": {"kafka": {"topic": "out"}},
        },
    }
    return PipelineRunner(
        PipelineConfig.model_validate(doc), redis_url=redis_url, base_dirs=[str(catalogue.parent)]
    )


FEEDBACK = {"when": "type == 'redeemed'", "outcome": "data.outcome", "weight": "redeem"}


def pacing(**extra: Any) -> dict[str, Any]:
    # the last day's shape: Holt-Winters fits cost ~0.3 s a roll (it has its own tests)
    return {
        "interval_s": 1,
        "intervals_per_day": DAY,
        "slack": 0.0,
        "forecast": "last_day",
        **extra,
    }


def req(i: int, predicted: float, segment: int = 0) -> CloudEvent:
    return CloudEvent.create(
        type="request",
        source="/app",
        id=f"r{i}",
        data={"scores": [1.0, 3.0], "segment": segment, "redeem": [predicted, predicted]},
    )


def redeemed(decision: Any, outcome: Any, i: int = 0) -> CloudEvent:
    return CloudEvent.create(
        type="redeemed", source="/shop", id=f"f{i}", data={"decision": decision, "outcome": outcome}
    )


@dataclass
class Day:
    """What a simulated day did: true consumption (outcomes known when deciding), coupons
    granted per interval, the used amount after each interval."""

    true_used: float = 0.0
    granted: list[int] = field(default_factory=list)
    used: list[float] = field(default_factory=list)
    caps: list[float] = field(default_factory=list)


def run_day(
    r: PipelineRunner,
    traffic: list[int],
    *,
    predicted: float,
    outcome: Callable[[int], float],
    lag: int,
    feedback: bool = True,
    history_days: int = 3,
) -> Day:
    """Seed ``history_days`` of the traffic shape into the forecast, then play one day: each
    interval's feedback due (``lag`` intervals after its decision) and its requests, one batch."""
    step = r.steps[0]
    now = [0.0]
    if step.pacer is not None:
        step.pacer.clock = lambda: now[0]
        for d in range(history_days):
            for t, n in enumerate(SHAPE):
                step.pacer.plan.forecast.observe(d * DAY + t, [t % 2] * n)
    start = history_days * DAY
    day, due, n, k = Day(), [], 0, [0, 0]
    for t, count in enumerate([*traffic, *([0] * (lag + 1))]):
        now[0] = start + t + 0.5
        arrived = [e for when, e in due if when <= t] if feedback else []
        due = [(when, e) for when, e in due if when > t]
        batch = arrived + [req(n + i, predicted, segment=i % 2) for i in range(count)]
        n += count
        outs = r.run(batch)
        granted = 0
        for e, out in zip(batch[len(arrived) :], outs[len(arrived) :]):
            assert not isinstance(out, Failure)
            item = out[0].data["item"]
            if item is not None:
                granted += 1
                segment = e.data["segment"]
                o = outcome(k[segment])  # each segment's coupons follow the pattern
                k[segment] += 1
                day.true_used += [1.0, 2.0][item] * o
                due.append((t + lag, redeemed(e.id, o, n)))
        if t < len(traffic):
            day.granted.append(granted)
            day.used.append(step.used_budget()[0])
            if step.pacer is not None:
                day.caps.append(float(step.pacer.plan.caps[0]))
    return day


def alternate(k: int) -> float:
    return float(k % 2)  # every other coupon redeemed: a rate of 0.5


def test_forecast_recovers_a_seasonal_series() -> None:
    config = PacingConfig(intervals_per_day=24, interval_s=3600)
    f = TrafficForecast(config, 2)
    curve = [100 + 60 * math.sin(2 * math.pi * h / 24) for h in range(24)]
    for i in range(3 * 24 + 6):
        v = curve[i % 24]
        # segment 1 is three times segment 0 at every hour
        f.observe(i, [0] * round(v / 4) + [1] * round(3 * v / 4))
    ahead = f.remaining(3 * 24 + 6)  # from 06:00 of the fourth day to its end
    assert ahead.shape == (2, 18)
    total = ahead.sum(0)
    for r, h in enumerate(range(6, 24)):
        assert total[r].item() == pytest.approx(curve[h], rel=0.1)
        assert (ahead[1, r] / total[r]).item() == pytest.approx(0.75, abs=0.02)
    # the last day's shape after one day; flat before
    last = TrafficForecast(PacingConfig(intervals_per_day=24, forecast="last_day"), 1)
    for h, v in enumerate(curve):
        last.observe(h, [0] * round(v))
    ahead = last.remaining(30)[0]  # 06:00 of the second day on: 06:00 to 23:00 of the first
    assert ahead.tolist() == pytest.approx([round(v) for v in curve[6:]], abs=1.5)
    flat = TrafficForecast(PacingConfig(intervals_per_day=24, forecast="flat"), 1)
    flat.observe(0, [0] * 10)
    assert flat.remaining(1)[0].tolist() == pytest.approx([10.0] * 23)


def test_pacing_spends_by_the_traffic_curve_where_greedy_spends_at_dawn(catalogue: Path) -> None:
    paced = run_day(
        runner(catalogue, pacing=pacing(feedback=FEEDBACK, forecast="holt_winters")),
        SHAPE,
        predicted=0.5,
        outcome=alternate,
        lag=3,
    )
    # every request wants 2 x 0.5 = 1 of the budget: demand is four times the budget
    half = sum(SHAPE[: DAY // 2]) / sum(SHAPE)
    assert sum(paced.granted[: DAY // 2]) / sum(paced.granted) == pytest.approx(half, abs=0.08)
    assert all(u <= BUDGET + 1e-9 for u in paced.used)
    assert BUDGET * 0.98 <= paced.true_used <= BUDGET + 2.0
    greedy = run_day(
        runner(catalogue), SHAPE, predicted=0.5, outcome=alternate, lag=3, feedback=False
    )
    assert greedy.used[5] == BUDGET  # greedy: all gone by the sixth interval
    assert paced.used[5] < 0.4 * BUDGET


@pytest.mark.parametrize("lag", [1, 3, 6])
def test_lagged_feedback_never_overspends(catalogue: Path, lag: int) -> None:
    r = runner(catalogue, pacing=pacing(feedback=FEEDBACK))
    day = run_day(r, SHAPE, predicted=0.5, outcome=alternate, lag=lag)
    assert all(u <= BUDGET + 1e-9 for u in day.used)
    assert BUDGET * 0.98 <= day.true_used <= BUDGET + 2.0  # at most the last coupon's 2 over
    stats = r.steps[0].stats()
    assert stats["feedback_settled"] == sum(day.granted) and stats["feedback_pending"] == 0


@pytest.mark.parametrize(("lag", "bound"), [(1, 1.02), (3, 1.02), (6, 1.12)])
def test_calibration_corrects_a_biased_rate(catalogue: Path, lag: int, bound: float) -> None:
    # predicted 0.25, redeemed at 0.5: reserving the prediction alone spends twice the budget
    blind = run_day(
        runner(catalogue, pacing=pacing()),
        SHAPE,
        predicted=0.25,
        outcome=alternate,
        lag=lag,
        feedback=False,
    )
    assert blind.true_used > 1.8 * BUDGET
    r = runner(catalogue, pacing=pacing(feedback=FEEDBACK, calibration={"prior": 2}))
    day = run_day(r, SHAPE, predicted=0.25, outcome=alternate, lag=lag)
    # what the decisions made before any feedback came back (half the day at lag 6) got wrong
    # is all that can go over: feedback corrects the budget, calibration the decisions in flight
    assert 0.95 * BUDGET <= day.true_used <= bound * BUDGET
    assert r.steps[0].pacer.calibration.factor(0) == pytest.approx(2.0, rel=0.1)


def test_underspend_is_recovered(catalogue: Path) -> None:
    # redeemed at a quarter of the predicted 0.5: feedback hands the unspent budget back, and a
    # three-interval outage's share is spread over the intervals after it
    traffic = [n if not 2 <= t <= 4 else 0 for t, n in enumerate(SHAPE)]
    day = run_day(
        runner(catalogue, pacing=pacing(feedback=FEEDBACK, calibration={"prior": 2})),
        traffic,
        predicted=0.5,
        outcome=lambda k: 1.0 if k % 4 == 0 else 0.0,
        lag=2,
    )
    assert BUDGET * 0.95 <= day.true_used <= BUDGET + 2.0
    assert sum(day.granted) > 1.8 * BUDGET  # twice the coupons the prediction allowed


def test_a_burst_spends_its_interval_share_only(catalogue: Path) -> None:
    traffic = list(SHAPE)
    traffic[3] *= 100
    day = run_day(
        runner(catalogue, pacing=pacing(feedback=FEEDBACK)),
        traffic,
        predicted=0.5,
        outcome=alternate,
        lag=1,
    )
    assert day.used[3] <= day.caps[3] + 1e-9
    assert day.used[3] - day.used[2] <= 0.2 * BUDGET  # the burst did not take the day
    assert day.true_used <= BUDGET + 2.0


def test_hostile_feedback(catalogue: Path) -> None:
    r = runner(catalogue, pacing=pacing(feedback=FEEDBACK))
    step = r.steps[0]
    [[a]] = r.run([req(1, 0.5)])
    assert a.data["item"] == 1
    used = step.used_budget()[0]
    outs = r.run(
        [
            redeemed("r1", float("nan"), 1),
            redeemed("r1", -1.0, 2),
            redeemed("r1", True, 3),
            redeemed(7, 1.0, 4),
            redeemed("nobody", 1.0, 5),
        ]
    )
    assert [type(o).__name__ for o in outs] == ["Failure", "Failure", "Failure", "Failure", "list"]
    assert "finite number >= 0; got nan" in outs[0].message
    assert "got -1.0" in outs[1].message
    assert "request id (a non-empty string); got 7" in outs[3].message
    assert outs[4] == []  # absorbed, counted
    assert step.used_budget()[0] == used
    assert step.stats()["feedback_unknown"] == 1 and step.stats()["feedback_errors"] == 4
    # the real one settles once; a duplicate is unknown
    assert r.run([redeemed("r1", 1.0, 6), redeemed("r1", 1.0, 7)]) == [[], []]
    assert step.used_budget()[0] == pytest.approx(used + 1.0)  # reserved 1, consumed 2
    assert step.stats()["feedback_unknown"] == 2


def test_decisions_without_feedback_settle_at_the_timeout(catalogue: Path) -> None:
    r = runner(catalogue, pacing=pacing(feedback={**FEEDBACK, "timeout_s": 10}))
    step = r.steps[0]
    now = [100.0]
    step.pacer.clock = lambda: now[0]
    r.run([req(i, 0.5) for i in range(4)])
    assert step.used_budget()[0] == pytest.approx(4.0)
    now[0] = 111.0
    r.run([])
    step.pacer.expire()
    assert step.used_budget()[0] == pytest.approx(0.0)  # not redeemed: nothing consumed
    assert step.stats()["feedback_expired"] == 4


def test_the_planner_prices_the_paced_allowance(catalogue: Path) -> None:
    r = runner(catalogue, plan={"every_s": 0.001, "window": 100}, pacing=pacing())
    step = r.steps[0]
    now = [0.5]
    step.pacer.clock = lambda: now[0]
    for t, n in enumerate(SHAPE * 2):
        now[0] = t + 0.5
        step.pacer.observe([0] * n)
    now[0] = 2 * DAY + 0.5
    r.run([req(i, 0.5) for i in range(40)])
    [planner] = r.timers()
    planner._last = 0.0
    assert planner.tick()
    # the window of 40 requests gets allowance / forecast requests x 40, well under the day's
    # budget: the duals price the budget
    assert step.memory_duals is not None and step.memory_duals[0] > 0


@pytest.mark.parametrize(
    ("spec", "expect"),
    [
        (
            {"plan": {"window": 100}},
            "plan.expected_requests is required without pacing",
        ),
        (
            {"pacing": {"feedback": {"when": "true", "weight": "cost"}}},
            "pacing.feedback.weight 'cost' is not one of weights ['redeem']",
        ),
        (
            {"pacing": {"calibration": {}}},
            "pacing.calibration needs pacing.feedback with a weight",
        ),
        ({"pacing": {"smoothing": 0}}, "smoothing"),
        ({"pacing": {"feedback": {"when": "data.x ==="}}}, "pacing.feedback.when"),
    ],
)
def test_config_errors(catalogue: Path, spec: dict[str, Any], expect: str) -> None:
    with pytest.raises((PipelineConfigError, ValueError), match=expect.replace("[", r"\[")):
        runner(catalogue, **spec)


@pytest.mark.redis
def test_ledger_on_redis_settles_each_decision_once(redis_url: str) -> None:
    from eventbus._internal.redis_client import connect
    from eventbus.pipelines.steps._allocate_feedback import DecisionLedger

    client = connect(redis_url)
    ledger = DecisionLedger("coupon", "ledger-test", client)
    other = DecisionLedger("coupon", "ledger-test", connect(redis_url))  # another replica
    ledger.add([("a", "ra"), ("b", "rb"), ("c", "rc")], now=100.0)
    assert other.pending() == 3
    assert other.take(["a", "zz"]) == ["ra", None]
    assert ledger.take(["a"]) == [None]  # already settled by the other replica
    assert ledger.expired(before=99.0) == []
    assert sorted(ledger.expired(before=100.5)) == ["rb", "rc"]
    assert ledger.pending() == 0
    client.close()


def test_the_loader_points_at_pacing_problems() -> None:
    from eventbus.pipelines import validate_pipeline_text

    text = textwrap.dedent(
        """\
        apiVersion: eventbus/v1
        kind: Pipeline
        metadata: {name: coupons}
        spec:
          sources: [{kafka: {topic: in}}]
          steps:
            - id: coupon
              allocate:
                catalogue: c.npz
                revenue: data.scores
                pacing:
                  slack: -1
                  feedback: {when: "type ==", decision: "dta.id"}
          sink: {kafka: {topic: out}}
        """
    )
    config, found = validate_pipeline_text(text, "p.yaml")
    assert config is None
    lines = [str(p) for p in found]
    assert any(
        x.startswith("p.yaml:12:") and "steps[0].allocate.pacing.slack" in x for x in lines
    ), lines
    assert any("pacing.feedback.when" in x and "p.yaml:13:" in x for x in lines), lines
    assert any("unknown variable 'dta'" in x for x in lines), lines


@pytest.mark.redis
def test_feedback_on_redis_is_settled_by_another_replica(catalogue: Path, redis_url: str) -> None:
    import uuid

    def replica() -> PipelineRunner:
        return runner(catalogue, name, redis_url, pacing=pacing(feedback=FEEDBACK))

    name = f"pacing-{uuid.uuid4().hex[:8]}"
    a, b = replica(), replica()
    [[out]] = a.run([req(1, 0.5)])
    assert out.data["item"] == 1
    assert a.steps[0].used_budget()[0] == pytest.approx(1.0)  # reserved 2 x 0.5
    # the redemption reaches the other replica: it settles the decision and corrects the budget
    assert b.run([redeemed("r1", 1.0)]) == [[]]
    assert a.steps[0].used_budget()[0] == pytest.approx(2.0)
    assert b.steps[0].stats()["feedback_settled"] == 1
    assert a.run([redeemed("r1", 1.0)]) == [[]]  # a duplicate: unknown, no second correction
    assert a.steps[0].stats()["feedback_unknown"] == 1
    assert b.steps[0].used_budget()[0] == pytest.approx(2.0)
