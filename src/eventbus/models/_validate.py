"""Validation of a new model version before it serves.

A candidate runs on the recorded recent requests (and the labelled samples, if any were
given): its outputs must be finite and shaped like the serving version's on the same inputs,
and, with a threshold, its accuracy on the labelled samples must reach it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ValidationReport", "accuracy", "validate_candidate"]


@dataclass(frozen=True)
class ValidationReport:
    """What validation found; ``ok`` is False with ``reason`` set when the candidate is refused."""

    ok: bool
    reason: str = ""
    checked_rows: int = 0
    accuracy: float | None = None


def accuracy(outputs: Any, labels: Any) -> float:
    """Fraction of rows predicted right: argmax for several outputs per row, ``> 0.5`` for one."""

    out = outputs.reshape(outputs.shape[0], -1)
    pred = out.argmax(dim=1) if out.shape[1] > 1 else (out[:, 0] > 0.5).long()
    return float((pred == labels.reshape(-1).long()).double().mean())


def validate_candidate(
    candidate: Any,
    recent: Any | None,
    *,
    serving: Any | None = None,
    labelled: tuple[Any, Any] | None = None,
    min_accuracy: float | None = None,
) -> ValidationReport:
    """Check a loaded candidate (``fn(tensor) -> tensor``).

    Args:
        candidate: the new version.
        recent: recorded recent input rows (a tensor, first dimension the rows) or None.
        serving: the version serving now, for the output shape (None: no reference).
        labelled: ``(x, y)`` labelled samples for the accuracy check.
        min_accuracy: the threshold (needs ``labelled``).
    """
    import torch

    rows = 0
    for label, x in (
        ("recorded requests", recent),
        ("labelled samples", labelled[0] if labelled else None),
    ):
        if x is None or len(x) == 0:
            continue
        try:
            out = candidate(x)
        except Exception as exc:  # noqa: BLE001 - any failure refuses the candidate
            return ValidationReport(
                False, f"it fails on {len(x)} {label}: {type(exc).__name__}: {exc}"
            )
        rows += len(x)
        if out.shape[0] != len(x):
            return ValidationReport(
                False, f"it gives {out.shape[0]} output rows for {len(x)} {label}"
            )
        if not bool(torch.isfinite(out.float()).all()):
            bad = int((~torch.isfinite(out.float())).reshape(len(x), -1).any(dim=1).sum())
            return ValidationReport(
                False, f"{bad} of {len(x)} {label} give non-finite outputs (NaN or inf)"
            )
        if serving is not None:
            try:
                ref = serving(x)
            except Exception:  # noqa: BLE001 - the old version cannot run these rows: no reference
                ref = None
            if ref is not None and tuple(ref.shape[1:]) != tuple(out.shape[1:]):
                return ValidationReport(
                    False,
                    f"its output per row has shape {tuple(out.shape[1:])}; the serving version's has {tuple(ref.shape[1:])}",
                )
    acc = None
    if labelled is not None and min_accuracy is not None:
        x, y = labelled
        acc = accuracy(candidate(x), y)
        if acc < min_accuracy:
            return ValidationReport(
                False,
                f"accuracy {acc:.4f} on {len(x)} labelled samples is below the threshold {min_accuracy:g}",
                rows,
                acc,
            )
    return ValidationReport(True, "", rows, acc)
