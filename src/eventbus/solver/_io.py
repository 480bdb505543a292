"""Problem files: ``.npz`` (NumPy) or ``.pt`` (torch) archives of named arrays.

Arrays (``n`` users, ``m`` items, ``K`` resources, ``G`` segments):

* ``revenue`` ``(n, m)`` float, ``budget`` ``(K,)`` float, always;
* factorised form: ``item_cost`` ``(K, m)``, ``segment_mask`` ``(K, G)``, ``segment`` ``(n,)``
  integer; optional weights ``(n, m)``: ``weight`` (the weight named ``weight``) and
  ``weight_<name>`` for the weight ``<name>``; optional ``row_weight`` ``(K,)`` strings, each
  resource's weight name or ``count`` (coefficient 1). Without ``row_weight`` every resource uses
  the only weight, or counts when there is none (files of earlier versions);
* sparse form: ``consumption_indices`` ``(3, nnz)`` integer rows ``(user, item, resource)`` and
  ``consumption_values`` ``(nnz,)`` float.

Float arrays keep their dtype (float32 or float64); other float dtypes are read as float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from eventbus.errors import SolverError
from eventbus.solver._factorised import COUNT
from eventbus.solver._problem import AllocationProblem, FactorisedConsumption

__all__ = ["load_problem", "save_problem"]

_FACTORISED = ("item_cost", "segment_mask", "segment")
_SPARSE = ("consumption_indices", "consumption_values")


def save_problem(problem: AllocationProblem, path: str | Path) -> None:
    """Write ``problem`` to a ``.npz`` or ``.pt`` file (see the module docstring for the format).

    Args:
        problem: the problem.
        path: destination; the suffix picks the format.

    Raises:
        SolverError: the suffix is neither ``.npz`` nor ``.pt``.
    """
    path = Path(path)
    arrays: dict[str, torch.Tensor] = {"revenue": problem.revenue, "budget": problem.budget}
    row_weight: list[str] | None = None
    cons = problem.consumption
    if isinstance(cons, FactorisedConsumption):
        arrays.update(
            item_cost=cons.item_cost, segment_mask=cons.segment_mask, segment=cons.segment
        )
        for name, w in cons.weights.items():
            arrays["weight" if name == "weight" else f"weight_{name}"] = w
        names = list(cons.weights)
        implied = (names[0] if len(names) == 1 else COUNT,) * cons.num_resources
        if len(names) > 1 or cons.row_weight != implied:
            row_weight = list(cons.row_weight or ())
    else:
        arrays.update(consumption_indices=cons.indices(), consumption_values=cons.values())
    if path.suffix == ".npz":
        host: dict[str, Any] = {k: v.detach().cpu().numpy() for k, v in arrays.items()}
        if row_weight is not None:
            host["row_weight"] = np.array(row_weight, dtype=str)
        np.savez(path, **host)
    elif path.suffix == ".pt":
        doc: dict[str, Any] = {k: v.detach().cpu() for k, v in arrays.items()}
        if row_weight is not None:
            doc["row_weight"] = row_weight
        torch.save(doc, path)
    else:
        msg = f"problem file {str(path)!r} must end in .npz or .pt; got suffix {path.suffix!r}"
        raise SolverError(msg)


def load_problem(path: str | Path) -> AllocationProblem:
    """Read a problem written by :func:`save_problem` (or by any tool following the format).

    Args:
        path: a ``.npz`` or ``.pt`` file.

    Returns:
        The validated :class:`AllocationProblem`.

    Raises:
        SolverError: the file cannot be read, misses arrays, or holds an invalid problem.

    Example:
        >>> import tempfile, os
        >>> from eventbus.solver import generate_problem
        >>> f = os.path.join(tempfile.mkdtemp(), "p.npz")
        >>> save_problem(generate_problem(5, 3, 2), f)
        >>> load_problem(f).num_resources
        2
    """
    path = Path(path)
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                raw: dict[str, Any] = {
                    k: np.array(data[k]).tolist()
                    if k == "row_weight"
                    else torch.from_numpy(np.array(data[k]))
                    for k in data.files
                }
        elif path.suffix == ".pt":
            raw = torch.load(path, map_location="cpu", weights_only=True)
        else:
            msg = f"problem file {str(path)!r} must end in .npz or .pt; got suffix {path.suffix!r}"
            raise SolverError(msg)
    except (OSError, ValueError, RuntimeError) as exc:
        if isinstance(exc, SolverError):
            raise
        msg = f"cannot read problem file {str(path)!r}: {exc}"
        raise SolverError(msg) from exc
    if not isinstance(raw, dict):
        msg = (
            f"problem file {str(path)!r} must hold a dict of named arrays; got {type(raw).__name__}"
        )
        raise SolverError(msg)
    row_weight = _row_weight(raw.pop("row_weight", None), path)
    arr = {k: _as_tensor(k, v, path) for k, v in raw.items()}
    missing = [k for k in ("revenue", "budget") if k not in arr]
    if all(k in arr for k in _FACTORISED):
        weights = {
            ("weight" if k == "weight" else k.removeprefix("weight_")): v
            for k, v in arr.items()
            if k == "weight" or k.startswith("weight_")
        }
        cons: Any = FactorisedConsumption(
            arr["item_cost"],
            arr["segment_mask"],
            arr["segment"].long(),
            weights=weights,
            row_weight=row_weight,
        )
    elif all(k in arr for k in _SPARSE):
        idx, vals = arr["consumption_indices"].long(), arr["consumption_values"]
        if (
            "revenue" in arr
            and idx.dim() == 2
            and idx.shape[0] == 3
            and vals.dim() == 1
            and "budget" in arr
        ):
            shape = (*arr["revenue"].shape, arr["budget"].shape[0])
            if idx.numel() and (
                idx.min() < 0 or bool((idx.max(1).values >= torch.tensor(shape)).any())
            ):
                msg = f"problem file {str(path)!r}: consumption_indices out of range for shape {shape}"
                raise SolverError(msg)
            cons = torch.sparse_coo_tensor(idx, vals, shape, check_invariants=True)
        else:
            msg = f"problem file {str(path)!r}: consumption_indices must be (3, nnz) and consumption_values (nnz,)"
            raise SolverError(msg)
    else:
        missing.append(f"either {', '.join(_FACTORISED)} or {', '.join(_SPARSE)}")
        cons = None
    if missing:
        msg = f"problem file {str(path)!r} misses arrays: {'; '.join(missing)} (present: {', '.join(sorted(arr)) or 'none'})"
        raise SolverError(msg)
    return AllocationProblem(arr["revenue"], arr["budget"], cons)


def _row_weight(value: Any, path: Path) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        msg = f"problem file {str(path)!r}: row_weight must be K strings (a weight name or 'count'); got {value!r:.80}"
        raise SolverError(msg)
    return tuple(value)


def _as_tensor(name: str, value: Any, path: Path) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        msg = (
            f"problem file {str(path)!r}: array {name!r} is a {type(value).__name__}, not an array"
        )
        raise SolverError(msg)
    if value.is_floating_point() and value.dtype not in (torch.float32, torch.float64):
        return value.float()
    return value
