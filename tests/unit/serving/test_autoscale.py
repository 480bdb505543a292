"""The autoscaling policies on synthetic Serve contexts (no Ray): the reactive policy follows
lag, in-flight batches and rate with hysteresis; the predictive one forecasts a cyclic load
and provisions ahead of it."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from eventbus.pipelines import PipelineConfig
from eventbus.serving._autoscale import LoadPolicy, forecast_rates, observe
from eventbus.serving._deployment import autoscaling_options


def ctx(
    per_replica: list[dict[str, float]],
    *,
    state: dict[str, Any] | None = None,
    now: float = 0.0,
    current: int | None = None,
    lo: int = 1,
    hi: int = 8,
    requests: float = 0.0,
) -> SimpleNamespace:
    """An object with the AutoscalingContext attributes the policy reads."""
    metrics: dict[str, dict[str, float]] = {}
    for i, m in enumerate(per_replica):
        for k, v in m.items():
            metrics.setdefault(k, {})[f"r{i}"] = v
    n = len(per_replica) if current is None else current
    return SimpleNamespace(
        aggregated_metrics=metrics,
        total_num_requests=requests,
        current_num_replicas=n,
        target_num_replicas=n,
        capacity_adjusted_min_replicas=lo,
        capacity_adjusted_max_replicas=hi,
        policy_state=state or {},
        current_time=now,
    )


def replica(
    lag: float = 0,
    in_flight: float = 0,
    rate: float = 0,
    arrival: float | None = None,
    partitions: float = 4,
) -> dict[str, float]:
    return {
        "eventbus_lag": lag,
        "eventbus_in_flight": in_flight,
        "eventbus_events_per_s": rate,
        "eventbus_arrival_per_s": rate if arrival is None else arrival,
        "eventbus_partitions": partitions,
    }


def test_observe_sums_replicas_and_takes_ongoing_requests() -> None:
    load = observe(
        ctx(
            [
                replica(lag=100, in_flight=1, rate=10, partitions=2),
                replica(lag=50, in_flight=2, rate=5, partitions=2),
            ],
            requests=1,
        )
    )
    assert load is not None
    assert (load.replicas, load.lag, load.in_flight, load.events_per_s, load.partitions) == (
        2,
        150,
        3,
        15,
        4,
    )
    assert observe(ctx([], current=1)) is None
    only_requests = observe(ctx([], current=1, requests=6))
    assert only_requests is not None and only_requests.in_flight == 6


def test_reactive_follows_lag_up_and_down_with_hysteresis() -> None:
    policy = LoadPolicy(
        {"target_lag": 1000, "scale_down_ratio": 0.7, "capacity_events_per_s": 1e9},
        placement="actor",
    )
    n = 1
    seen = []
    for lag in [0, 500, 2500, 6000, 6000, 2000, 1300, 800, 0]:
        n, _ = policy(ctx([replica(lag=lag / n)] * n))
        seen.append(n)
    # up at once to ceil(lag / target); down only when the load fits fewer replicas at 70%
    assert seen == [1, 1, 3, 6, 6, 3, 2, 2, 1]


def test_reactive_in_flight_and_rate_signals() -> None:
    policy = LoadPolicy(
        {"target_in_flight": 2, "capacity_events_per_s": 100, "target_utilization": 0.5}
    )
    assert policy(ctx([replica(in_flight=4)] * 2))[0] == 4  # 8 batches in flight / 2 per replica
    assert policy(ctx([replica(rate=100)]))[0] == 2  # 100/s at 50% of 100/s per replica
    assert (
        policy(ctx([replica(rate=40, arrival=260, partitions=8)]))[0] == 6
    )  # arrivals, not what is served


def test_bounds_and_partition_cap() -> None:
    policy = LoadPolicy({"target_lag": 10})
    assert (
        policy(ctx([replica(lag=10_000, partitions=3)], hi=8))[0] == 3
    )  # consumers past the partitions idle
    assert (
        LoadPolicy({"target_lag": 10}, placement="actor")(
            ctx([replica(lag=10_000, partitions=3)], hi=8)
        )[0]
        == 8
    )
    assert policy(ctx([replica()], lo=2))[0] == 2


def test_learns_capacity_from_a_backlogged_replica() -> None:
    policy = LoadPolicy({"target_lag": 1000, "target_utilization": 1.0})
    _, state = policy(ctx([replica(lag=5000, rate=200, arrival=400)]))
    assert state["eventbus"]["learned_capacity"] == 200
    # the backlog gone, 600/s arriving needs 3 replicas of 200/s
    n, _ = policy(ctx([replica(lag=0, rate=600, arrival=600)], state=state))
    assert n == 3


def sine_rate(t: float, season: float) -> float:
    return 1000 + 900 * math.sin(2 * math.pi * t / season)


def test_forecast_rates_follows_a_seasonal_series() -> None:
    season = 24
    history = [sine_rate(i, season) for i in range(3 * season)]
    ahead = forecast_rates(history, season, 6)
    for k, v in enumerate(ahead):
        assert v == pytest.approx(sine_rate(3 * season + k, season), abs=60)
    with pytest.raises(ValueError, match="two seasons"):
        forecast_rates(history[:30], season, 3)


def test_predictive_leads_a_sine_load_and_reactive_lags_it() -> None:
    season_s, step_s, capacity = 240.0, 1.0, 200.0
    cfg = {
        "season_s": season_s,
        "samples_per_season": 24,
        "lead_s": 20,
        "capacity_events_per_s": capacity,
        "target_utilization": 1.0,
        "target_lag": 1e9,
        "scale_down_ratio": 1.0,
        "refit_every_s": 30,
    }
    predictive = LoadPolicy({**cfg, "policy": "predictive"}, background_fit=False)
    reactive = LoadPolicy({**cfg, "policy": "reactive"})
    state: dict[str, Any] = {}
    first_forecast = None
    lead_seen = []
    t = 0.0
    while t < 4 * season_s:
        rate = sine_rate(t, season_s)
        n = 1
        p, state = predictive(
            ctx([replica(rate=rate, partitions=32)], state=state, now=t, current=n, hi=20)
        )
        r, _ = reactive(ctx([replica(rate=rate, partitions=32)], now=t, current=n, hi=20))
        if state["eventbus"].get("forecast_per_s") is not None and first_forecast is None:
            first_forecast = t
        if t >= 3 * season_s:
            # the replicas the load will need 15 s from now
            later = math.ceil(sine_rate(t + 15, season_s) / capacity - 1e-9)
            lead_seen.append((p, r, later))
        t += step_s
    # reactive until two seasons of history are in
    assert (
        first_forecast is not None
        and 2 * season_s <= first_forecast < 2 * season_s + 2 * season_s / 24
    )
    # on the rising edge the forecast provisions for the load ahead; the reactive count does not
    rising = [(p, r, later) for p, r, later in lead_seen if later > r]
    assert rising
    # (samples are 10 s means, so a peak inside one is under-forecast by a little)
    assert sum(p >= later for p, r, later in rising) / len(rising) > 0.85
    assert all(p >= later - 1 for p, r, later in rising)
    assert all(p >= r for p, r, _ in lead_seen)


def test_predictive_history_is_bounded_and_gaps_filled() -> None:
    policy = LoadPolicy(
        {
            "policy": "predictive",
            "season_s": 40,
            "samples_per_season": 4,
            "history_seasons": 2,
            "refit_every_s": 1e6,
        },
        background_fit=False,
    )
    state: dict[str, Any] = {}
    for t in range(0, 200, 5):
        _, state = policy(ctx([replica(rate=t)], state=state, now=float(t)))
    assert len(state["eventbus"]["history"]) == 8
    _, state = policy(ctx([replica(rate=1)], state=state, now=400.0))  # nobody observed 200-400 s
    assert len(state["eventbus"]["history"]) == 8


def test_autoscaling_options_name_the_policy() -> None:
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "p"},
        "spec": {
            "sources": [{"kafka": {"topic": "a"}}],
            "sink": {"kafka": {"topic": "b"}},
            "serving": {
                "replicas": {"min": 1, "max": 4},
                "autoscaling": {"policy": "predictive", "season_s": 600},
            },
        },
    }
    opts = autoscaling_options(PipelineConfig.model_validate(doc))
    assert opts["policy"]["policy_function"] == "eventbus.serving._autoscale:LoadPolicy"
    assert opts["policy"]["policy_kwargs"]["config"]["season_s"] == 600
    from ray.serve.config import AutoscalingConfig as ServeAutoscaling

    serve_cfg = ServeAutoscaling(**opts)  # Serve accepts it, and pickles the policy
    policy = serve_cfg.policy.get_policy()(**serve_cfg.policy.policy_kwargs)
    assert policy(ctx([replica(lag=50_000)]))[0] == 4
