"""The ``allocate`` step's configuration, its Redis key for the duals, and its registry hooks
(CEL expressions to check, a working example); the runtime is in :mod:`._allocate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eventbus._internal import keys
from eventbus.errors import ConfigError
from eventbus.pipelines.steps._allocate_pacing_config import PacingConfig

__all__ = [
    "AllocateConfig",
    "PacingConfig",
    "PlanConfig",
    "duals_key",
    "effective_rows",
    "example",
    "expressions",
    "publish_duals",
]


class PlanConfig(BaseModel):
    """Nearline re-planning: re-solve the duals from a window of recent requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    every_s: float = Field(
        default=30,
        gt=0,
        le=86400,
        description="Re-solve at most this often (one replica solves; a Redis lock).",
    )
    window: int = Field(
        default=10_000, ge=10, le=10_000_000, description="Most recent requests the re-solve uses."
    )
    expected_requests: int | None = Field(
        default=None,
        ge=1,
        description="Requests expected over the whole budget period: the window gets the remaining budget "
        "times window / (expected_requests - requests seen so far). With pacing: not used (the "
        "window gets the interval's paced share, by the traffic forecast).",
    )
    gap: float = Field(
        default=1e-3, gt=0, lt=1, description="Certified relative gap of each re-solve."
    )


class AllocateConfig(BaseModel):
    """Online allocation at dual prices (``steps: [{id: ..., allocate: {...}}]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    catalogue: str = Field(
        min_length=1,
        description="A problem file of eventbus.solver (.npz/.pt) giving item_cost (K, m), segment_mask "
        "(K, G) and budget (K,); relative paths are read beside the pipeline file.",
    )
    revenue: str = Field(
        min_length=1, description="CEL: the request's revenue for each of the m items (a list)."
    )
    segment: str = Field(
        default="0", min_length=1, description="CEL: the request's segment, an integer in [0, G)."
    )
    weights: dict[str, str] = Field(
        default_factory=dict,
        description="CEL per named weight of the catalogue (its row_weight): the request's weight for "
        "each of the m items (a list of non-negative numbers). Resources counting in a weight use it; "
        "'count' resources (and the unnamed 'weight' of older catalogues, when not given here) count 1.",
    )
    output: str = Field(
        default="item",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="data field set to the chosen item index, or null.",
    )
    refresh_s: float = Field(
        default=1.0, gt=0, le=3600, description="How often the duals are re-read from Redis."
    )
    plan: PlanConfig | None = Field(
        default=None,
        description="Re-solve the duals nearline from recent requests (without a redeploy).",
    )
    pacing: PacingConfig | None = Field(
        default=None,
        description="Pace each budget over the day by a traffic forecast, correct it from "
        "consumption feedback, recalibrate the predicted rates.",
    )

    @model_validator(mode="after")
    def _pacing_fits(self) -> AllocateConfig:
        if self.plan is not None and self.plan.expected_requests is None and self.pacing is None:
            msg = (
                "plan.expected_requests is required without pacing (the requests expected over "
                "the budget period); set it, or add pacing: {} to split budgets by a traffic forecast"
            )
            raise ValueError(msg)
        feedback = self.pacing.feedback if self.pacing is not None else None
        weight = feedback.weight if feedback is not None else None
        if weight is not None and weight not in self.weights:
            msg = (
                f"pacing.feedback.weight {weight!r} is not one of weights "
                f"{sorted(self.weights)}; name one of them, or leave weight out"
            )
            raise ValueError(msg)
        if self.pacing is not None and self.pacing.calibration is not None and weight is None:
            msg = (
                "pacing.calibration needs pacing.feedback with a weight (the predicted rate it "
                "recalibrates from the outcomes); add feedback: {when: ..., weight: <name>}"
            )
            raise ValueError(msg)
        return self


def duals_key(pipeline: str, step: str) -> str:
    """The Redis key holding the duals of an ``allocate`` step."""
    return keys.duals(pipeline, step)


def publish_duals(redis_url: str, pipeline: str, step: str, duals: Any) -> None:
    """Publish λ to a pipeline's ``allocate`` step; replicas pick it up within ``refresh_s``."""
    from eventbus._internal.redis_client import connect

    values = [float(x) for x in (duals.tolist() if hasattr(duals, "tolist") else duals)]
    connect(redis_url).set(duals_key(pipeline, step), json.dumps(values))


def effective_rows(step_id: str, spec: AllocateConfig, rows: tuple[str, ...]) -> tuple[str, ...]:
    """Each resource's weight as the step applies it; ConfigError for a weight without CEL."""
    from eventbus.solver._factorised import COUNT

    used = sorted({r for r in rows if r != COUNT})
    unknown = sorted(set(spec.weights) - set(used))
    if unknown:
        msg = (
            f"step {step_id!r}: weights {unknown} are not weights of catalogue {spec.catalogue!r} "
            f"(its resources count in {used or 'no weight'}); remove them or fix the names"
        )
        raise ConfigError(msg)
    # the unnamed 'weight' of older catalogues was never applied by this step: it still counts 1
    missing = [r for r in used if r not in spec.weights and r != "weight"]
    if missing:
        msg = (
            f"step {step_id!r}: catalogue {spec.catalogue!r} has resources counting in weights "
            f"{missing} and the step gives no CEL for them; add weights: {{{missing[0]}: <CEL list of "
            f"the request's {missing[0]} per item>}}"
        )
        raise ConfigError(msg)
    return tuple(r if r in spec.weights else COUNT for r in rows)


def expressions(raw: Any) -> list[tuple[tuple[int | str, ...], str, bool]]:
    if not isinstance(raw, dict):
        return []
    pacing = raw.get("pacing")
    feedback = pacing.get("feedback") if isinstance(pacing, dict) else None
    found = [
        (("pacing", "feedback", field), feedback[field], False)
        for field in ("when", "decision", "outcome")
        if isinstance(feedback, dict) and isinstance(feedback.get(field), str) and feedback[field]
    ]
    return (
        found
        + [
            ((field,), raw[field], False)
            for field in ("revenue", "segment")
            if isinstance(raw.get(field), str) and raw[field]
        ]
        + [
            (("weights", name), expr, False)
            for name, expr in (raw.get("weights") or {}).items()
            if isinstance(raw.get("weights"), dict) and isinstance(expr, str) and expr
        ]
    )


def example(folder: Any) -> dict[str, Any]:
    """A working config over a small catalogue written into ``folder`` (behaviour suites)."""
    import torch

    from eventbus.solver import AllocationProblem, FactorisedConsumption, save_problem

    cons = FactorisedConsumption(
        torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0]]), torch.zeros(1, dtype=torch.long)
    )
    save_problem(
        AllocationProblem(torch.tensor([[1.0, 1.0]]), torch.tensor([10.0]), cons),
        Path(folder) / "catalogue.npz",
    )
    return {"catalogue": "catalogue.npz", "revenue": "[1.0, 2.0]"}
