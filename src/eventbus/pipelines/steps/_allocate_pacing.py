"""The pacing plan of an ``allocate`` step (``pacing:``): a traffic forecast per segment, the
share of each remaining budget the current interval may spend, and the per-segment calibration
of the predicted rate.

The forecast: request counts per segment per interval; the total is forecast over the rest of
the period by Holt-Winters (:func:`eventbus._internal.forecast.forecast_rates`, the autoscaler's)
once two periods are seen, by the last period's shape after one, flat before; each segment gets
its share of the total at that time of day over the periods seen. Resource k's traffic is the
sum over the segments its mask covers. Only shapes matter (the plan uses ratios), so a replica's
own counts serve when several replicas share the traffic.

The plan, at the start of each interval: remaining_k = budget_k - used_k (used: the consumption
reserved by decisions, corrected by the feedback that has come back, so decisions still in
flight count at their estimate); share_k = F_k(now) / sum over the rest of the period of F_k,
smoothed against the previous interval's; the interval may take used_k up to
``used_k + remaining_k * share_k * (1 + slack)``, never past budget_k. What an interval leaves
unspent stays in remaining_k and is spread over the intervals after it.

The correction (``gain``, a PI controller on spend vs plan, as ad systems pace budgets): at each
interval's start, e_k = (allowance_k - spent_k) / allowance_k of the interval before, clipped to
[-1, 1], and I_k = the sum of the e_k, clipped to [-4, 4]; the re-solve's budget is multiplied by
exp(gain * (e_k + I_k / 4)), within [1/4, 4]. A forecast that runs high (a spike that inflates
the next intervals) makes the duals too high and the spend short of plan: the correction lowers
them; the interval's cap still holds off overspending.
"""

from __future__ import annotations

import math
from typing import Any

from eventbus.pipelines.steps._allocate_pacing_config import CalibrationConfig, PacingConfig

__all__ = ["Calibration", "PacingPlan", "TrafficForecast"]


class TrafficForecast:
    """Request counts per segment per interval, and the forecast of the rest of the period.

    Args:
        config: the step's ``pacing:``.
        num_segments: G.
    """

    def __init__(self, config: PacingConfig, num_segments: int) -> None:
        self.config = config
        self.num_segments = num_segments
        self.counts: dict[int, list[float]] = {}  # interval index -> count per segment
        # the last Holt-Winters fit: the interval it forecast from and two periods ahead of it;
        # refitted every 1/24 of a period (a fit takes ~0.1-1 s)
        self._fit: tuple[int, list[float]] | None = None
        self.refit_intervals = max(1, config.intervals_per_day // 24)
        if config.forecast == "holt_winters":
            # statsmodels' import takes seconds: at deploy time, not in the first batch
            import statsmodels.tsa.holtwinters  # noqa: F401

    def observe(self, index: int, segments: list[int]) -> None:
        """Count requests of these segments in interval ``index``."""
        row = self.counts.setdefault(index, [0.0] * self.num_segments)
        for s in segments:
            row[s] += 1.0
        keep = self.config.history_days * self.config.intervals_per_day
        if len(self.counts) > keep + 1:
            for old in sorted(self.counts)[: len(self.counts) - keep - 1]:
                del self.counts[old]

    def remaining(self, index: int) -> Any:
        """The forecast requests per segment, a ``(G, R)`` tensor for intervals ``index`` to the
        end of its period (R of them); from the intervals before ``index`` only."""
        import torch

        season = self.config.intervals_per_day
        pos = index % season
        steps = season - pos
        past = [i for i in self.counts if i < index]
        first = min(past, default=index)
        history = [sum(self.counts.get(i, ())) for i in range(first, index)]
        total = self._total(history, season, steps, index)
        # each segment's share of the total at each time of day, over the periods seen (pulled
        # toward its share over all of them, and toward even when nothing was seen)
        g = self.num_segments
        by_pos = torch.zeros(g, season, dtype=torch.float64)
        for i in past:
            by_pos[:, i % season] += torch.tensor(self.counts[i], dtype=torch.float64)
        overall = by_pos.sum(1)
        overall = overall / overall.sum() if overall.sum() > 0 else torch.full((g,), 1.0 / g)
        share = (by_pos + overall[:, None]) / (by_pos.sum(0, keepdim=True) + 1.0)
        cols = torch.arange(pos, season)
        return share[:, cols] * torch.tensor(total, dtype=torch.float64)[None, :]

    def _total(self, history: list[float], season: int, steps: int, index: int) -> list[float]:
        method = self.config.forecast
        if method == "holt_winters" and len(history) >= 2 * season and sum(history) > 0:
            from eventbus._internal.forecast import forecast_rates

            fit = self._fit
            if fit is None or not 0 <= index - fit[0] < self.refit_intervals:
                fit = self._fit = (
                    index,
                    forecast_rates(winsorised(history, season), season, 2 * season),
                )
            ahead = fit[1][index - fit[0] : index - fit[0] + steps]
            return [max(v, 1e-9) for v in ahead]
        if method != "flat" and len(history) >= season:
            # the same times of the last period: base[r] was one period before interval index + r
            base = history[len(history) - season :]
            out = base[:steps]
            mean = sum(base) / season
            return [max(v, 1e-3 * mean, 1e-9) for v in out]
        level = sum(history) / len(history) if history else 1.0  # per interval, as seen so far
        return [max(level, 1e-9)] * steps


def winsorised(history: list[float], season: int, window: int = 5) -> list[float]:
    """``history`` with each interval from the second period on that is outside [1/2, 3/2] of
    what it was expected to be replaced by that expectation: the same interval a period before (as clipped) times the median, over
    the last ``window`` intervals, of the ratio of each to its own a period before. A burst is
    not the new level (the Holt-Winters level and trend would carry it for hours), but a shift
    that lasts moves the median within ``window // 2 + 1`` intervals and passes."""
    import statistics

    robust = list(history)
    ratios = [1.0] * window  # no change, until the second period says otherwise
    for i in range(season, len(robust)):
        ratios.append(history[i] / max(history[i - season], 1.0))
        expected = max(robust[i - season], 1.0) * statistics.median(ratios[-window:])
        if not expected / 2 <= robust[i] <= expected * 1.5:
            robust[i] = expected
    return robust


class PacingPlan:
    """The per-interval spending caps of an allocate step (see the module docstring).

    Args:
        config: the step's ``pacing:``.
        mask: the catalogue's segment mask, ``(K, G)``.
    """

    def __init__(self, config: PacingConfig, mask: Any) -> None:
        self.config = config
        self.mask = mask
        self.forecast = TrafficForecast(config, int(mask.shape[1]))
        self.index: int | None = None
        self.ratio: Any = None  # smoothed share x remaining intervals (1: an even split)
        self.caps: Any = None  # the current interval's limit on used, per resource
        self.allowance: Any = None  # what the interval may spend, per resource
        self.start_used: Any = None  # used at the interval's start
        self.next_requests: Any = None  # forecast requests of the interval, per resource
        self.ahead: Any = None  # forecast requests of the rest of the period, per resource
        self.integral: Any = None  # the controller's summed spend-vs-plan error, per resource
        self.correction: Any = None  # the re-solve budget's multiplier, per resource

    def interval(self, now: float) -> int:
        """The index of the interval ``now`` falls in."""
        return math.floor(now / self.config.interval_s)

    def roll(self, index: int, used: Any, budget: Any) -> None:
        """Start interval ``index`` (``used``: what is used so far, per resource)."""
        import torch

        remaining_steps = self.config.intervals_per_day - index % self.config.intervals_per_day
        fc = self.forecast.remaining(index)  # (G, R)
        ahead = self.mask @ fc.sum(1)  # (K,)
        now = self.mask @ fc[:, 0]
        share = torch.where(ahead > 0, now / ahead.clamp_min(1e-300), 1.0 / remaining_steps)
        ratio = share * remaining_steps
        if self.ratio is not None and self.index == index - 1 and remaining_steps > 1:
            s = self.config.smoothing
            ratio = s * ratio + (1 - s) * self.ratio
        self.ratio = ratio
        share = (ratio / remaining_steps).clamp(0.0, 1.0)
        if remaining_steps == 1:
            share = torch.ones_like(share)
        remaining = (budget - used).clamp_min(0.0)
        self._control(index, used)
        self.index = index
        self.start_used = used.clone()
        self.allowance = remaining * share
        self.next_requests = now
        self.ahead = ahead
        self.caps = torch.minimum(budget, used + self.allowance * (1 + self.config.slack))

    def _control(self, index: int, used: Any) -> None:
        """Update the spend-vs-plan correction from the interval that just ended (if it is the
        one before ``index``; a new period starts the integral afresh)."""
        import torch

        gain = self.config.gain
        if self.integral is None or index % self.config.intervals_per_day == 0:
            self.integral = torch.zeros_like(used)
            self.correction = torch.ones_like(used)
        if gain == 0 or self.index != index - 1 or self.allowance is None:
            return
        spent = used - self.start_used
        error = torch.where(
            self.allowance > 0,
            (self.allowance - spent) / self.allowance.clamp_min(1e-300),
            torch.zeros_like(used),
        ).clamp(-1.0, 1.0)
        self.integral = (self.integral + error).clamp(-4.0, 4.0)
        self.correction = torch.exp(gain * (error + self.integral / 4)).clamp(0.25, 4.0)

    def figures(self, budget: Any) -> dict[str, Any]:
        """Budget planned vs spent in the current interval (for stats and the dashboard)."""
        if self.caps is None:
            return {}
        return {
            "pacing_interval": self.index,
            "pacing_allowance": float(self.allowance.sum()),
            "pacing_cap_fraction": float((self.caps / budget.clamp_min(1e-300)).mean()),
            "pacing_correction": [round(float(c), 4) for c in self.correction],
        }


class Calibration:
    """Per-segment factor on the predicted rate: (observed + prior) / (predicted + prior) over
    the settled decisions, clipped to [1/max_factor, max_factor].

    Args:
        config: the step's ``pacing.calibration``.
        num_segments: G.
    """

    def __init__(self, config: CalibrationConfig, num_segments: int) -> None:
        self.config = config
        self.observed = [0.0] * num_segments
        self.predicted = [0.0] * num_segments

    def update(self, segment: int, predicted: float, observed: float) -> None:
        """One settled decision: its raw predicted rate (before calibration) and its outcome."""
        self.observed[segment] += observed
        self.predicted[segment] += predicted

    def factor(self, segment: int) -> float:
        p = self.config.prior
        f = (self.observed[segment] + p) / (self.predicted[segment] + p)
        return min(max(f, 1.0 / self.config.max_factor), self.config.max_factor)

    def factors(self, segments: list[int]) -> list[float]:
        return [self.factor(s) for s in segments]
