"""The ``allocate`` step's ``pacing:`` configuration: the traffic forecast and pacing plan, the
consumption feedback that corrects the remaining budgets, and the calibration of the predicted
rates; the runtime is in :mod:`._allocate_pacing`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CalibrationConfig", "FeedbackConfig", "PacingConfig"]


class FeedbackConfig(BaseModel):
    """Consumption feedback (redemptions...): events on the pipeline's sources, arriving after
    the decision they belong to, that say what it really consumed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    when: str = Field(
        min_length=1,
        description="CEL: true for a feedback event (e.g. type == 'coupon.redeemed'); the step "
        "consumes it (no output) and every other event is a request.",
    )
    decision: str = Field(
        default="data.decision",
        min_length=1,
        description="CEL: the id of the request event the feedback belongs to (a string).",
    )
    outcome: str = Field(
        default="1.0",
        min_length=1,
        description="CEL: the realised value (a finite number >= 0) of `weight` for the decision "
        "(1.0: redeemed); without `weight`, the factor on the whole reserved consumption.",
    )
    weight: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The named weight (of `weights:`) the outcome realises: resources counting in it "
        "are corrected, the others keep what was reserved. None: the outcome scales every resource.",
    )
    timeout_s: float = Field(
        default=3600,
        gt=0,
        le=7 * 86400,
        description="A decision with no feedback after this long settles at `missing_outcome`.",
    )
    missing_outcome: float = Field(
        default=0.0,
        ge=0,
        description="The outcome of a decision whose feedback never came (0: nothing consumed).",
    )


class CalibrationConfig(BaseModel):
    """Per-segment multiplicative calibration of the predicted rate (the feedback's `weight`):
    factor = (observed outcomes + prior) / (predicted + prior) over settled decisions."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    prior: float = Field(
        default=10.0,
        gt=0,
        description="Pseudo-count pulling each segment's factor toward 1 until it has feedback.",
    )
    max_factor: float = Field(
        default=10.0, gt=1, le=1000, description="Factors are clipped to [1/max, max]."
    )


class PacingConfig(BaseModel):
    """Budget pacing over a day: a traffic forecast per segment splits each remaining budget
    over the remaining intervals; each interval may spend its share (smoothed) and no more."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    interval_s: float = Field(
        default=300, gt=0, le=86400, description="Length of one pacing interval."
    )
    intervals_per_day: int = Field(
        default=288,
        ge=2,
        le=100_000,
        description="Intervals in the budget period (the forecast's season): the budgets are spread "
        "over the period's remaining intervals, and all of what is left may go in its last one.",
    )
    forecast: Literal["holt_winters", "last_day", "flat"] = Field(
        default="holt_winters",
        description="Traffic forecast: Holt-Winters on the request counts once two periods are seen "
        "(else the last period's shape, else flat); last_day: the last period's shape; flat: even.",
    )
    history_days: int = Field(
        default=7, ge=2, le=60, description="Periods of per-segment request counts kept."
    )
    smoothing: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Weight of the new forecast share against the previous interval's (1: none).",
    )
    slack: float = Field(
        default=0.25,
        ge=0,
        le=10,
        description="An interval may spend its share times 1 + slack (never past the budget).",
    )
    gain: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="Spend-vs-plan correction of the re-solve's budget (PI on the duals): each "
        "interval's spend short of (over) its allowance raises (lowers) the next windows' budget "
        "by exp(gain x (error + integral / 4)), within [1/4, 4]; 0 (the default): off.",
    )
    feedback: FeedbackConfig | None = Field(
        default=None, description="Correct the remaining budgets from consumption feedback."
    )
    calibration: CalibrationConfig | None = Field(
        default=None,
        description="Recalibrate the predicted rate (the feedback's weight) per segment.",
    )
