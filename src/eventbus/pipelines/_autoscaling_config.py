"""The ``serving.autoscaling:`` section of a pipeline: how replicas scale between their bounds.

```yaml
serving:
  replicas: {min: 1, max: 8}
  autoscaling:
    policy: predictive          # or reactive (the default)
    target_lag: 5000            # records behind per replica
    target_in_flight: 2         # batches in flight per replica
    capacity_events_per_s: 800  # what one replica sustains (learned when absent)
    season_s: 86400             # the daily cycle the forecast follows
    lead_s: 120                 # scale this far ahead of the forecast load
```
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, model_validator

__all__ = ["AutoscalingConfig"]

_MODEL = ConfigDict(extra="forbid", frozen=True)


class AutoscalingConfig(BaseModel):
    """Scaling on load (consumer lag, in-flight batches, event rate), optionally ahead of a
    forecast daily cycle. Takes effect when ``replicas.min < replicas.max``."""

    model_config = _MODEL
    policy: Literal["reactive", "predictive"] = Field(
        default="reactive",
        description="'reactive': replicas follow the measured load. 'predictive': also forecast the "
        "event rate one season ahead (Holt-Winters, additive seasonal) and scale ahead of it; "
        "reactive until two seasons of history are in.",
    )
    target_lag: PositiveFloat = Field(
        default=10_000,
        description="Kafka consumer lag (records not yet delivered and committed) per replica to aim at.",
    )
    target_in_flight: PositiveFloat = Field(
        default=2, description="Micro-batches in flight per replica to aim at."
    )
    capacity_events_per_s: PositiveFloat | None = Field(
        default=None,
        description="Events per second one replica sustains; the rate-based and forecast-based "
        "targets divide by it. Absent: learned from the rates replicas reach while behind.",
    )
    target_utilization: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.8, description="Share of a replica's capacity to plan for (headroom for bursts)."
    )
    scale_down_ratio: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.7,
        description="Hysteresis: scale down only to a count that would run at most this share of "
        "the targets (the load must fall well below what fewer replicas can take).",
    )
    upscale_delay_s: Annotated[float, Field(ge=0)] = Field(
        default=2.0, description="A scale-up decision must hold this long before it is applied."
    )
    downscale_delay_s: Annotated[float, Field(ge=0)] = Field(
        default=30.0, description="A scale-down decision must hold this long before it is applied."
    )
    look_back_s: PositiveFloat = Field(
        default=5.0, description="Window the replicas' metrics are averaged over."
    )
    metrics_interval_s: PositiveFloat = Field(
        default=1.0, description="How often replicas report their metrics to the Serve controller."
    )
    season_s: PositiveFloat = Field(
        default=86_400, description="Predictive: the length of the load cycle (a day)."
    )
    samples_per_season: Annotated[int, Field(ge=4, le=1440)] = Field(
        default=48,
        description="Predictive: rate samples per season (48: one per 30 minutes of a day).",
    )
    history_seasons: Annotated[int, Field(ge=2, le=14)] = Field(
        default=4,
        description="Predictive: seasons of rate history kept (the fit uses at most these).",
    )
    lead_s: Annotated[float, Field(ge=0)] = Field(
        default=600,
        description="Predictive: provision now for the highest rate forecast within this many "
        "seconds (replica start-up plus a rebalance, with margin).",
    )
    refit_every_s: PositiveFloat | None = Field(
        default=None,
        description="Predictive: refit the model at most this often (default: once per sample).",
    )

    @model_validator(mode="after")
    def _sample_fits(self) -> AutoscalingConfig:
        if (
            self.policy == "predictive"
            and self.season_s / self.samples_per_season < self.metrics_interval_s
        ):
            msg = (
                f"autoscaling.season_s / samples_per_season ({self.season_s / self.samples_per_season:g} s) is "
                f"shorter than metrics_interval_s ({self.metrics_interval_s:g} s); use fewer samples per season"
            )
            raise ValueError(msg)
        return self

    @property
    def sample_s(self) -> float:
        """Seconds per rate sample of the forecast."""
        return self.season_s / self.samples_per_season
