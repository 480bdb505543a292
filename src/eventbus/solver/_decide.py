"""Per-request decisions from solved duals: the best item by reduced cost, or none."""

from __future__ import annotations

import torch

from eventbus.errors import SolverError
from eventbus.solver._problem import Consumption, FactorisedConsumption

__all__ = ["decide"]


def decide(duals: torch.Tensor, revenue: torch.Tensor, consumption: Consumption) -> torch.Tensor:
    """Choose an item for each request of a batch at dual prices ``duals``.

    Each request gets the item of the largest reduced cost ``revenue[i, j] - duals . m[i, j, :]``,
    or ``-1`` when every reduced cost is negative (ties: the lowest item index; a reduced cost of
    exactly 0 still gets the item). Vectorised over the batch; no budget is tracked here, the
    duals price the budgets in.

    Args:
        duals: ``(K,)`` non-negative duals, e.g. ``solve(...).duals``.
        revenue: ``(B, m)`` revenue of each request for each item.
        consumption: the batch's consumption: a :class:`FactorisedConsumption` whose ``segment``
            (and weights) cover the ``B`` requests, or a dense or sparse ``(B, m, K)`` tensor.

    Returns:
        ``(B,)`` int64 chosen item per request, ``-1`` for none.

    Raises:
        SolverError: shapes do not fit together.

    Example:
        >>> import torch
        >>> cons = FactorisedConsumption(torch.tensor([[1.0, 4.0]]), torch.ones(1, 1), torch.zeros(2, dtype=torch.long))
        >>> decide(torch.tensor([0.5]), torch.tensor([[1.0, 2.8], [0.2, 0.1]]), cons).tolist()
        [1, -1]
    """
    if revenue.dim() != 2:
        msg = f"revenue must be a (B, m) tensor; got shape {tuple(revenue.shape)}"
        raise SolverError(msg)
    bsz, m = revenue.shape
    lam = duals.to(revenue.device, torch.float64)
    if isinstance(consumption, FactorisedConsumption):
        k_num = consumption.num_resources
        if consumption.segment.shape[0] != bsz or consumption.item_cost.shape[1] != m:
            msg = (
                f"consumption must cover the batch ({bsz} requests, {m} items); got "
                f"{consumption.segment.shape[0]} segments and {consumption.item_cost.shape[1]} items"
            )
            raise SolverError(msg)
        _check_duals(lam, k_num)
        seg = consumption.segment.to(revenue.device)
        cost = torch.zeros_like(revenue)
        for name, pi in consumption.prices(lam):
            part = pi.to(revenue.device, revenue.dtype)[seg]
            w = consumption.weight_of(name)
            cost += part if w is None else part * w.to(revenue.device, revenue.dtype)
    elif (
        isinstance(consumption, torch.Tensor)
        and consumption.dim() == 3
        and tuple(consumption.shape[:2]) == (bsz, m)
    ):
        _check_duals(lam, int(consumption.shape[2]))
        lam_c = lam.to(revenue.dtype)
        if consumption.layout == torch.sparse_coo:
            c = consumption.coalesce()
            idx = c.indices()
            cost = torch.zeros(bsz * m, dtype=revenue.dtype, device=revenue.device)
            cost.index_add_(0, idx[0] * m + idx[1], c.values().to(revenue.dtype) * lam_c[idx[2]])
            cost = cost.view(bsz, m)
        else:
            cost = consumption.to(revenue.dtype) @ lam_c
    else:
        got = (
            tuple(consumption.shape)
            if isinstance(consumption, torch.Tensor)
            else type(consumption).__name__
        )
        msg = f"consumption must be a FactorisedConsumption or a ({bsz}, {m}, K) tensor; got {got}"
        raise SolverError(msg)
    reduced = revenue - cost
    if m == 0:
        return torch.full((bsz,), -1, dtype=torch.long, device=revenue.device)
    value, item = reduced.max(1)
    return torch.where(value >= 0, item, torch.full_like(item, -1))


def _check_duals(lam: torch.Tensor, k_num: int) -> None:
    if (
        lam.shape != (k_num,)
        or not bool(torch.isfinite(lam).all())
        or (k_num and float(lam.min()) < 0)
    ):
        msg = (
            f"duals must be a finite, non-negative ({k_num},) tensor; got shape {tuple(lam.shape)}"
        )
        raise SolverError(msg)
