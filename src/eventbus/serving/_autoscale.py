"""Autoscaling policies of pipeline deployments (Ray Serve custom autoscaling policies).

Every replica reports its load through ``record_autoscaling_stats`` (``_deployment``): the
consumer lag of its partitions, the micro-batches it has in flight, the events it processes
per second, the records arriving in its partitions per second and its partition count. Serve
averages each over ``look_back_s`` per replica and hands them to the policy in
``AutoscalingContext.aggregated_metrics``; the policy sums them over the replicas.

Reactive: each signal says how many replicas the load needs (lag / target lag, in-flight /
target in-flight, rate / capacity); the largest wins. Up at once (after ``upscale_delay_s``),
down only when the load would run fewer replicas at ``scale_down_ratio`` of the targets (and
after ``downscale_delay_s``): hysteresis against flapping.

Predictive: the arrival rate is sampled into a bounded history (``samples_per_season`` per
``season_s``, ``history_seasons`` kept) in the policy state; from two seasons on, a
Holt-Winters model (additive seasonal, damped additive trend; statsmodels) is refitted at
most once per sample, on a background thread so the Serve controller's loop never waits on
it, and the policy provisions for the highest rate forecast within ``lead_s``:
``max(reactive, ceil(forecast / (capacity * target_utilization)))``.

With ``source_placement: replica`` a replica is a consumer-group member, so replicas past the
partition count would idle: the policy does not scale past it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

from eventbus._internal.forecast import forecast_rates

__all__ = ["METRICS", "Load", "LoadPolicy", "forecast_rates", "observe"]

#: The metric names replicas report (``PipelineDeployment.record_autoscaling_stats``).
METRICS = (
    "eventbus_lag",
    "eventbus_in_flight",
    "eventbus_events_per_s",
    "eventbus_arrival_per_s",
    "eventbus_partitions",
)

_STATE = "eventbus"  # our key in the policy state (Serve keeps its own keys beside it)


@dataclass(frozen=True)
class Load:
    """The deployment's load, summed over its replicas."""

    replicas: int  #: replicas that reported
    lag: float  #: records behind
    in_flight: float  #: micro-batches in flight (or ongoing requests, whichever is larger)
    events_per_s: float  #: events processed per second
    arrival_per_s: float  #: records arriving per second
    partitions: int  #: partitions assigned


def observe(ctx: Any) -> Load | None:
    """The load in an ``AutoscalingContext``; None before any replica reported."""
    metrics = ctx.aggregated_metrics or {}
    per = {name: metrics.get(name) or {} for name in METRICS}
    reported = set().union(*(m.keys() for m in per.values()))
    requests = float(ctx.total_num_requests or 0)
    if not reported:
        return None if requests <= 0 else Load(0, 0.0, requests, 0.0, 0.0, 0)
    total = {name: float(sum(v.values())) for name, v in per.items()}
    return Load(
        replicas=len(reported),
        lag=total["eventbus_lag"],
        in_flight=max(total["eventbus_in_flight"], requests),
        events_per_s=total["eventbus_events_per_s"],
        arrival_per_s=total["eventbus_arrival_per_s"],
        partitions=round(total["eventbus_partitions"]),
    )


class LoadPolicy:
    """A Serve autoscaling policy (a class: Serve makes one per deployment and calls it each
    control-loop tick with an ``AutoscalingContext``).

    Args:
        config: the pipeline's ``serving.autoscaling`` (as a JSON-able dict).
        placement: the pipeline's ``source_placement``.
        background_fit: fit the forecast on a thread (False: inline, for tests).
    """

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        placement: str = "replica",
        background_fit: bool = True,
    ) -> None:
        from eventbus.pipelines._autoscaling_config import AutoscalingConfig

        self.config = AutoscalingConfig.model_validate(config or {})
        self.placement = placement
        self._background = background_fit
        self._fitting: threading.Thread | None = None
        self._fitted: dict[str, Any] | None = (
            None  # the background fit's result, not yet in the state
        )
        self._lock = threading.Lock()

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        state = dict(ctx.policy_state or {})
        mine = dict(state.get(_STATE) or {})
        now = float(ctx.current_time)
        current = int(ctx.current_num_replicas)
        load = observe(ctx)
        if load is None:
            state[_STATE] = mine
            return int(ctx.target_num_replicas), state
        capacity = self._capacity(load, mine)
        desired = self._reactive(load, current, capacity)
        mine.update(reactive=desired, capacity=capacity)
        if self.config.policy == "predictive":
            self._record(mine, now, load.arrival_per_s)
            rate = self._forecast(mine, now)
            mine["forecast_per_s"] = rate
            if rate is not None and capacity:
                ahead = math.ceil(rate / (capacity * self.config.target_utilization) - 1e-9)
                mine["predicted"] = ahead
                desired = max(desired, ahead)
        if self.placement == "replica" and load.partitions > 0:
            desired = min(desired, max(load.partitions, current))
        desired = max(
            ctx.capacity_adjusted_min_replicas, min(ctx.capacity_adjusted_max_replicas, desired)
        )
        mine["desired"] = desired
        state[_STATE] = mine
        return desired, state

    # -- reactive --------------------------------------------------------------------------------
    def _capacity(self, load: Load, mine: dict[str, Any]) -> float | None:
        """Events/s one replica sustains: configured, or learned from replicas that are behind
        (a backlogged replica runs at its capacity)."""
        if self.config.capacity_events_per_s is not None:
            return self.config.capacity_events_per_s
        learned = mine.get("learned_capacity")
        n = max(1, load.replicas)
        if load.lag / n >= 0.5 * self.config.target_lag and load.events_per_s > 0:
            observed = load.events_per_s / n
            if learned is None:
                learned = observed
            elif observed >= 0.5 * learned:  # a rebalance stall is no measure of capacity
                learned = 0.7 * learned + 0.3 * observed
            mine["learned_capacity"] = learned
        return learned

    def _reactive(self, load: Load, current: int, capacity: float | None) -> int:
        cfg = self.config
        need = max(load.lag / cfg.target_lag, load.in_flight / cfg.target_in_flight)
        if capacity:
            rate = max(load.arrival_per_s, load.events_per_s)
            need = max(need, rate / (capacity * cfg.target_utilization))
        up = math.ceil(need - 1e-9)
        if up > current:
            return up
        down = max(1, math.ceil(need / cfg.scale_down_ratio - 1e-9))
        return min(current, down) if current > 0 else up

    # -- predictive ------------------------------------------------------------------------------
    def _record(self, mine: dict[str, Any], now: float, rate: float) -> None:
        """Add one rate observation to the current sample; close the samples passed."""
        cfg = self.config
        bucket = math.floor(now / cfg.sample_s)
        open_ = mine.get("open")  # [bucket, sum, count]
        history = list(mine.get("history") or [])
        if open_ is not None and open_[0] != bucket:
            mean = open_[1] / max(1, open_[2])
            gap = min(bucket - open_[0] - 1, cfg.samples_per_season)  # samples nobody observed
            history.extend([mean] * (1 + max(0, gap)))
            keep = cfg.history_seasons * cfg.samples_per_season
            history = history[-keep:]
            mine["history"] = history
            mine["history_end"] = bucket  # the bucket after the last closed sample
            open_ = None
        if open_ is None:
            open_ = [bucket, 0.0, 0]
        mine["open"] = [bucket, open_[1] + rate, open_[2] + 1]

    def _forecast(self, mine: dict[str, Any], now: float) -> float | None:
        """The highest rate forecast from now to ``lead_s`` ahead; None before a fit."""
        cfg = self.config
        history = mine.get("history") or []
        season = cfg.samples_per_season
        refit = cfg.refit_every_s if cfg.refit_every_s is not None else cfg.sample_s
        with self._lock:
            fitted, self._fitted = self._fitted, None
        if fitted is not None:
            mine["forecast"] = fitted
        due = now - float(mine.get("fit_at", -math.inf)) >= refit
        if (
            len(history) >= 2 * season
            and due
            and (self._fitting is None or not self._fitting.is_alive())
        ):
            mine["fit_at"] = now
            steps = math.ceil(cfg.lead_s / cfg.sample_s) + 2
            job = (list(history), int(mine["history_end"]), steps)
            if self._background:
                self._fitting = threading.Thread(
                    target=self._fit, args=job, name="eventbus-forecast", daemon=True
                )
                self._fitting.start()
            else:
                self._fit(*job)
                with self._lock:
                    fitted, self._fitted = self._fitted, None
                mine["forecast"] = fitted
        forecast = mine.get("forecast")
        if not forecast:
            return None
        first = math.floor(now / cfg.sample_s) - forecast["from"]
        last = math.floor((now + cfg.lead_s) / cfg.sample_s) - forecast["from"]
        values = forecast["values"][max(0, first) : last + 1]
        return max(values) if values else None

    def _fit(self, history: list[float], end: int, steps: int) -> None:
        try:
            values = forecast_rates(history, self.config.samples_per_season, steps)
        except Exception:
            import logging

            logging.getLogger("eventbus.serving.autoscale").warning(
                "forecast fit failed", exc_info=True
            )
            return
        with self._lock:
            self._fitted = {"from": end, "values": values}
