"""One forward pass over the rows of several calls, shared by a model's own application
(:mod:`eventbus.models._serve`) and multiplexed pools (:mod:`eventbus.models._pool`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

from eventbus.errors import ModelError
from eventbus.models._artifact import LoadedModel

__all__ = ["Active", "Mirror", "Observe", "forward"]

#: What serves: (version, model, split version or None, its model or None, split weight).
Active = tuple[int, LoadedModel, int | None, LoadedModel | None, float]
#: Told of every model pass: (version, rows, rows failed, seconds).
Observe = Callable[[int, int, int, float], None]
#: Given every answered group: (input rows tensor, outputs numpy, draws numpy or None, seconds).
Mirror = Callable[[Any, Any, Any, float], None]


def _timed(model: LoadedModel, x: Any, version: int, observe: Observe | None) -> Any:
    start = time.perf_counter()
    try:
        y = model(x)
    except BaseException:
        if observe is not None:
            observe(version, int(x.shape[0]), int(x.shape[0]), time.perf_counter() - start)
        raise
    if observe is not None:
        observe(version, int(x.shape[0]), 0, time.perf_counter() - start)
    return y


def forward(
    name: str,
    active: Active,
    calls: list[tuple[Any, Any]],
    *,
    observe: Observe | None = None,
    mirror: Mirror | None = None,
) -> tuple[list[Any], int, Any]:
    """Rows of several calls through the serving model (and the split's, by each row's draw).

    Each call is ``(x, u)``: rows (numpy, first dimension the rows) and each row's draw in
    [0, 1) for the A/B split (or None). Returns the answers, one per call (``(outputs,
    versions)`` or ``("error", message)``), the rows run, and the last rows run (or None).
    ``observe`` is told of each model pass (per version: rows, failed rows, seconds), ``mirror``
    is given each answered group's rows and outputs (a shadow experiment; it must not block).
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
        u = None
        if any(calls[i][1] is not None for i in idx):
            u = np.concatenate(
                [c[1] if c[1] is not None else np.ones(len(c[0])) for c in (calls[i] for i in idx)]
            )
        start = time.perf_counter()
        try:
            if b_model is None or weight <= 0:
                y = _timed(model, x, version, observe)
                versions = np.full(n, version, dtype=np.int64)
            else:
                if u is None:
                    u = np.ones(n)
                to_b = torch.from_numpy(u < weight)
                versions = np.where(u < weight, cast(int, b_version), version).astype(np.int64)
                parts = []
                for mask, m, v in ((~to_b, model, version), (to_b, b_model, cast(int, b_version))):
                    if bool(mask.any()):
                        parts.append((mask, _timed(m, x[mask], v, observe)))
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
        if mirror is not None:
            mirror(x, ynp, u, time.perf_counter() - start)
        at = 0
        for i, xi in zip(idx, xs):
            k = len(xi)
            out[i] = (ynp[at : at + k], versions[at : at + k])
            at += k
        rows += n
        last = x
    return out, rows, last
