"""The Holt-Winters traffic forecast shared by the predictive autoscaler
(:mod:`eventbus.serving._autoscale`) and the allocate step's pacing plan
(:mod:`eventbus.pipelines.steps._allocate_pacing`)."""

from __future__ import annotations

__all__ = ["forecast_rates"]


def forecast_rates(history: list[float], season: int, steps: int) -> list[float]:
    """Forecast ``steps`` samples past ``history`` with Holt-Winters (additive seasonal of
    ``season`` samples, damped additive trend); rates never go below 0.

    Raises:
        ValueError: fewer than two seasons of history.
    """
    if len(history) < 2 * season:
        msg = f"a seasonal forecast needs two seasons of history ({2 * season} samples); got {len(history)}"
        raise ValueError(msg)
    import warnings

    import numpy as np
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    y = np.asarray(history, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter of the optimiser
        try:
            fit = ExponentialSmoothing(
                y,
                trend="add",
                damped_trend=True,
                seasonal="add",
                seasonal_periods=season,
                initialization_method="estimated",
            ).fit()
            out = fit.forecast(steps)
            if not np.all(np.isfinite(out)):
                raise ValueError("non-finite forecast")
        except Exception:  # noqa: BLE001 - a degenerate series (constant, zeros): plain seasonal
            fit = ExponentialSmoothing(
                y,
                trend=None,
                seasonal="add",
                seasonal_periods=season,
                initialization_method="heuristic",
            ).fit()
            out = fit.forecast(steps)
    return [max(0.0, float(v)) for v in out]
