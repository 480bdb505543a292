"""One forward pass over the rows of several calls, shared by a model's own application
(:mod:`eventbus.models._serve`) and multiplexed pools (:mod:`eventbus.models._pool`)."""

from __future__ import annotations

from typing import Any, cast

from eventbus.errors import ModelError
from eventbus.models._artifact import LoadedModel

__all__ = ["Active", "forward"]

#: What serves: (version, model, split version or None, its model or None, split weight).
Active = tuple[int, LoadedModel, int | None, LoadedModel | None, float]


def forward(name: str, active: Active, calls: list[tuple[Any, Any]]) -> tuple[list[Any], int, Any]:
    """Rows of several calls through the serving model (and the split's, by each row's draw).

    Each call is ``(x, u)``: rows (numpy, first dimension the rows) and each row's draw in
    [0, 1) for the A/B split (or None). Returns the answers, one per call (``(outputs,
    versions)`` or ``("error", message)``), the rows run, and the last rows run (or None).
    """
    import numpy as np
    import torch

    version, model, b_version, b_model, weight = active
    out: list[Any] = [None] * len(calls)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (x, _) in enumerate(calls):
        groups.setdefault(tuple(x.shape[1:]), []).append(i)
    rows = 0
    last = None
    for shape, idx in groups.items():
        xs = [calls[i][0] for i in idx]
        x = torch.from_numpy(
            np.concatenate(xs)
            if len(xs) > 1
            else (xs[0] if xs[0].flags.writeable else xs[0].copy())
        )
        n = x.shape[0]
        try:
            if b_model is None or weight <= 0:
                y = model(x)
                versions = np.full(n, version, dtype=np.int64)
            else:
                u = np.concatenate(
                    [
                        c[1] if c[1] is not None else np.ones(len(c[0]))
                        for c in (calls[i] for i in idx)
                    ]
                )
                to_b = torch.from_numpy(u < weight)
                versions = np.where(u < weight, cast(int, b_version), version).astype(np.int64)
                parts = []
                for mask, m in ((~to_b, model), (to_b, b_model)):
                    if bool(mask.any()):
                        parts.append((mask, m(x[mask])))
                y = torch.empty((n, *parts[0][1].shape[1:]), dtype=parts[0][1].dtype)
                for mask, part in parts:
                    y[mask] = part
            if y.shape[0] != n:
                msg = f"model {name!r} version {version} gave {y.shape[0]} output rows for {n} input rows"
                raise ModelError(msg)
            ynp = y.numpy()
        except Exception as exc:  # noqa: BLE001 - answer each caller with the reason
            reason = (
                f"model {name!r} failed on input rows of shape {shape}: {type(exc).__name__}: {exc}"
            )
            for i in idx:
                out[i] = ("error", reason)
            continue
        start = 0
        for i, xi in zip(idx, xs):
            k = len(xi)
            out[i] = (ynp[start : start + k], versions[start : start + k])
            start += k
        rows += n
        last = x
    return out, rows, last
