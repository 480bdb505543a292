"""A model step's figures in a pipeline's view: its pool's loads and evictions, its model's
shadow experiment (the steps report them as the model's replicas last told)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["POOL_FIGURES", "SHADOW_FIGURES", "model_figures"]

#: What status and ``/metrics`` show of a model step on a pool (besides the pool's name).
POOL_FIGURES = ("loads", "evictions", "failed_loads", "models")
#: What status and ``/metrics`` show of a model step's shadow experiment (with the model's name,
#: the candidate ``version`` and the mirrored ``share``); None where not known yet.
SHADOW_FIGURES = (
    "rows",
    "agreement",
    "mad",
    "errors",
    "dropped_rows",
    "live_p99_ms",
    "candidate_p99_ms",
)


def _number(v: Any) -> float | None:
    """A figure a replica reported: a finite number, else None (unknown)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return v


def model_figures(
    steps: dict[str, Any],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """``model_pools`` and ``model_shadows`` of a view, from its merged ``steps``."""
    model_pools = {
        sid: {
            "pool": st["stats"].get("pool"),
            **{k: st["stats"].get(f"pool_{k}", 0) for k in POOL_FIGURES},
        }
        for sid, st in steps.items()
        if "pool_loads" in st["stats"]
    }
    model_shadows = {
        sid: {
            "model": str(sh.get("model", "")),
            "version": sh.get("version"),
            "share": sh.get("share"),
            **{k: _number(sh.get(k)) for k in SHADOW_FIGURES},
        }
        for sid, st in steps.items()
        if isinstance(sh := st["stats"].get("shadow"), dict)
    }
    return model_pools, model_shadows
