"""The allocation problem: revenue, budgets and consumption in a factorised or a sparse form.

The linear program, for users ``i < n``, items ``j < m`` and resources ``k < K``::

    maximise    sum_ij c[i, j] x[i, j]
    subject to  sum_j x[i, j] <= 1                         (each user gets at most one item)
                sum_ij m[i, j, k] x[i, j] <= b[k]          (budgets and inventories)
                0 <= x[i, j] <= 1

Consumption ``m`` comes in one of two forms:

* :class:`FactorisedConsumption`: ``m[i, j, k] = W_k[i, j] * item_cost[k, j] *
  segment_mask[k, segment[i]]``. ``item_cost`` is ``cost_j * A[k, j]`` (the per-item cost on the
  item subset of resource ``k``), ``segment_mask`` says which user segments resource ``k``
  applies to, and each resource's weight ``W_k`` is one of several named per-(user, item)
  matrices (a redemption probability, so that budgets count expected spend) or ``count``
  (coefficient 1: inventories count coupons). One pass over the data is ``O(n * m)`` per weight
  in use, whatever ``K``.
* a sparse COO tensor of shape ``(n, m, K)`` (the general form).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eventbus.errors import SolverError
from eventbus.solver._factorised import FactorisedConsumption
from eventbus.solver._factorised import check_finite_nonneg as _check_finite_nonneg
from eventbus.solver._factorised import float_tensor as _float_tensor

__all__ = ["AllocationProblem", "Consumption", "FactorisedConsumption"]


def _bad(what: str, got: str, fix: str) -> SolverError:
    return SolverError(f"{what}; got {got}; {fix}")


Consumption = FactorisedConsumption | torch.Tensor
"""Either a :class:`FactorisedConsumption` or a sparse COO tensor of shape ``(n, m, K)``."""


@dataclass(frozen=True)
class AllocationProblem:
    """One allocation LP: revenue ``c (n, m)``, budgets ``b (K,)`` and consumption.

    Tensors stay where they are (CPU or CUDA); the solver computes in ``revenue``'s dtype and sums
    over users in float64. A sparse ``consumption`` is coalesced on construction.

    Args:
        revenue: ``(n, m)`` finite revenue of giving item ``j`` to user ``i``.
        budget: ``(K,)`` positive budgets and inventories.
        consumption: a :class:`FactorisedConsumption` or a sparse COO ``(n, m, K)`` tensor with
            non-negative values.

    Raises:
        SolverError: a tensor has the wrong shape, dtype or sign, or is not finite.

    Example:
        >>> import torch
        >>> cons = FactorisedConsumption(torch.ones(1, 2), torch.ones(1, 1), torch.zeros(3, dtype=torch.long))
        >>> p = AllocationProblem(torch.rand(3, 2), torch.tensor([1.5]), cons)
        >>> p.num_users, p.num_items, p.num_resources
        (3, 2, 1)
    """

    revenue: torch.Tensor
    budget: torch.Tensor
    consumption: Consumption

    def __post_init__(self) -> None:
        rev = _float_tensor("revenue", self.revenue, 2)
        if not bool(torch.isfinite(rev).all()):
            raise _bad(
                "revenue must be finite",
                "NaN or infinity",
                "use a large negative revenue for items a user may not get",
            )
        _float_tensor("budget", self.budget, 1)
        _check_finite_nonneg("budget", self.budget, positive=True)
        n, m = rev.shape
        cons = self.consumption
        if isinstance(cons, FactorisedConsumption):
            if cons.segment.shape[0] != n or cons.item_cost.shape[1] != m:
                raise _bad(
                    f"consumption must match revenue's shape ({n} users, {m} items)",
                    f"{cons.segment.shape[0]} users and {cons.item_cost.shape[1]} items",
                    "build segment with one entry per user and item_cost with one column per item",
                )
        elif isinstance(cons, torch.Tensor):
            if cons.layout != torch.sparse_coo or cons.dim() != 3:
                raise _bad(
                    "a tensor consumption must be a sparse COO tensor of shape (n, m, K)",
                    f"layout {cons.layout} with {cons.dim()} dimension(s)",
                    "build it with torch.sparse_coo_tensor(indices, values, (n, m, K))",
                )
            if tuple(cons.shape[:2]) != (n, m):
                raise _bad(
                    f"consumption must have shape ({n}, {m}, K)",
                    f"{tuple(cons.shape)}",
                    "match revenue's shape",
                )
            if not cons.is_floating_point():
                raise _bad(
                    "consumption values must be floating point",
                    f"dtype {cons.dtype}",
                    "cast with .float()",
                )
            if not cons.is_coalesced():
                object.__setattr__(self, "consumption", cons.coalesce())
            _check_finite_nonneg("consumption values", self.consumption.values())  # type: ignore[union-attr]
        else:
            raise _bad(
                "consumption must be a FactorisedConsumption or a sparse COO tensor",
                type(cons).__name__,
                "see eventbus.solver.FactorisedConsumption",
            )
        k = self.consumption_rows()
        if self.budget.shape[0] != k:
            raise _bad(
                "budget must have one entry per resource",
                f"{self.budget.shape[0]} entries for {k} resources",
                f"give it shape ({k},)",
            )

    def consumption_rows(self) -> int:
        """``K`` as the consumption sees it (used by validation)."""
        cons = self.consumption
        return cons.num_resources if isinstance(cons, FactorisedConsumption) else int(cons.shape[2])

    @property
    def num_users(self) -> int:
        """``n``."""
        return int(self.revenue.shape[0])

    @property
    def num_items(self) -> int:
        """``m``."""
        return int(self.revenue.shape[1])

    @property
    def num_resources(self) -> int:
        """``K``."""
        return int(self.budget.shape[0])

    @property
    def is_factorised(self) -> bool:
        """Whether consumption is a :class:`FactorisedConsumption`."""
        return isinstance(self.consumption, FactorisedConsumption)

    def to(self, device: torch.device | str) -> AllocationProblem:
        """The same problem with every tensor on ``device``."""
        cons = self.consumption
        cons = cons.to(device)  # a FactorisedConsumption or a sparse tensor
        return AllocationProblem(self.revenue.to(device), self.budget.to(device), cons)

    def to_sparse(self) -> AllocationProblem:
        """The same problem with consumption as a sparse COO ``(n, m, K)`` tensor."""
        cons = self.consumption
        if not isinstance(cons, FactorisedConsumption):
            return self
        from eventbus.solver._tosparse import factorised_to_sparse

        n, m = self.revenue.shape
        sparse = factorised_to_sparse(cons, n, m)
        return AllocationProblem(self.revenue, self.budget, sparse)

    def dense_consumption(self) -> torch.Tensor:
        """Consumption as a dense ``(n, m, K)`` tensor (small problems only: tests, references)."""
        cons = self.consumption
        if isinstance(cons, FactorisedConsumption):
            return cons.dense()
        return cons.to_dense()
