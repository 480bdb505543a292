"""The allocation problem: revenue, budgets and consumption in a factorised or a sparse form.

The linear program, for users ``i < n``, items ``j < m`` and resources ``k < K``::

    maximise    sum_ij c[i, j] x[i, j]
    subject to  sum_j x[i, j] <= 1                         (each user gets at most one item)
                sum_ij m[i, j, k] x[i, j] <= b[k]          (budgets and inventories)
                0 <= x[i, j] <= 1

Consumption ``m`` comes in one of two forms:

* :class:`FactorisedConsumption`: ``m[i, j, k] = weight[i, j] * item_cost[k, j] *
  segment_mask[k, segment[i]]``. ``item_cost`` is ``cost_j * A[k, j]`` (the per-item cost on the
  item subset of resource ``k``), ``segment_mask`` says which user segments resource ``k``
  applies to, and the optional ``weight`` scales per user and item (a redemption probability,
  so that budgets count expected spend). One pass over the data is ``O(n * m)`` whatever ``K``.
* a sparse COO tensor of shape ``(n, m, K)`` (the general form).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eventbus.errors import SolverError

__all__ = ["AllocationProblem", "Consumption", "FactorisedConsumption"]


def _bad(what: str, got: str, fix: str) -> SolverError:
    return SolverError(f"{what}; got {got}; {fix}")


def _float_tensor(name: str, value: object, ndim: int) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise _bad(
            f"{name} must be a torch.Tensor",
            type(value).__name__,
            "convert it with torch.as_tensor(...)",
        )
    if not value.is_floating_point():
        raise _bad(
            f"{name} must be a floating-point tensor",
            f"dtype {value.dtype}",
            "cast it with .float()",
        )
    if value.dim() != ndim:
        raise _bad(
            f"{name} must have {ndim} dimension(s)", f"shape {tuple(value.shape)}", "reshape it"
        )
    return value


def _check_finite_nonneg(name: str, value: torch.Tensor, *, positive: bool = False) -> None:
    if value.numel() == 0:
        return
    if not bool(torch.isfinite(value).all()):
        raise _bad(
            f"{name} must be finite", "NaN or infinity", "replace them (use 0 for 'no consumption')"
        )
    low = float(value.min())
    if low < 0 or (positive and low <= 0):
        kind = "positive" if positive else "non-negative"
        raise _bad(
            f"{name} must be {kind}",
            f"a minimum of {low!r}",
            f"clip it, e.g. {name}.clamp_min(...)",
        )


@dataclass(frozen=True)
class FactorisedConsumption:
    """Consumption ``m[i, j, k] = weight[i, j] * item_cost[k, j] * segment_mask[k, segment[i]]``.

    Args:
        item_cost: ``(K, m)`` non-negative; resource ``k``'s use per unit of item ``j`` (0 outside
            the resource's item subset).
        segment_mask: ``(K, G)`` non-negative, usually 0/1; whether resource ``k`` applies to users
            of segment ``g``.
        segment: ``(n,)`` integer segment of each user, in ``[0, G)``.
        weight: optional ``(n, m)`` non-negative per user-item factor (default all ones).

    Example:
        >>> import torch
        >>> cons = FactorisedConsumption(torch.ones(1, 3), torch.ones(1, 1), torch.zeros(2, dtype=torch.long))
        >>> cons.num_resources, cons.num_segments
        (1, 1)
    """

    item_cost: torch.Tensor
    segment_mask: torch.Tensor
    segment: torch.Tensor
    weight: torch.Tensor | None = None

    def __post_init__(self) -> None:
        _float_tensor("item_cost", self.item_cost, 2)
        _float_tensor("segment_mask", self.segment_mask, 2)
        if self.segment_mask.shape[0] != self.item_cost.shape[0]:
            raise _bad(
                "segment_mask must have one row per resource (item_cost's first dimension)",
                f"{self.segment_mask.shape[0]} rows for {self.item_cost.shape[0]} resources",
                "give segment_mask the shape (K, num_segments)",
            )
        seg = self.segment
        if (
            not isinstance(seg, torch.Tensor)
            or seg.dtype not in (torch.int32, torch.int64)
            or seg.dim() != 1
        ):
            got = f"{getattr(seg, 'dtype', type(seg).__name__)} of shape {tuple(getattr(seg, 'shape', ()))}"
            raise _bad(
                "segment must be a 1-D int64 tensor (one segment per user)",
                got,
                "use torch.as_tensor(..., dtype=torch.long)",
            )
        if seg.numel() and (int(seg.min()) < 0 or int(seg.max()) >= self.segment_mask.shape[1]):
            raise _bad(
                f"segment values must lie in [0, {self.segment_mask.shape[1]}) (segment_mask's columns)",
                f"range [{int(seg.min())}, {int(seg.max())}]",
                "renumber the segments or widen segment_mask",
            )
        if self.weight is not None:
            _float_tensor("weight", self.weight, 2)
            want = (seg.shape[0], self.item_cost.shape[1])
            if tuple(self.weight.shape) != want:
                raise _bad(
                    "weight must have shape (num_users, num_items)",
                    f"{tuple(self.weight.shape)}",
                    f"give it shape {want}",
                )
            _check_finite_nonneg("weight", self.weight)
        _check_finite_nonneg("item_cost", self.item_cost)
        _check_finite_nonneg("segment_mask", self.segment_mask)

    @property
    def num_resources(self) -> int:
        """``K``, the number of resource rows."""
        return int(self.item_cost.shape[0])

    @property
    def num_segments(self) -> int:
        """``G``, the number of user segments."""
        return int(self.segment_mask.shape[1])


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
            _check_finite_nonneg("consumption values", self.consumption._values())  # type: ignore[union-attr]
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
        if isinstance(cons, FactorisedConsumption):
            w = None if cons.weight is None else cons.weight.to(device)
            cons = FactorisedConsumption(
                cons.item_cost.to(device), cons.segment_mask.to(device), cons.segment.to(device), w
            )
        else:
            cons = cons.to(device)
        return AllocationProblem(self.revenue.to(device), self.budget.to(device), cons)

    def to_sparse(self) -> AllocationProblem:
        """The same problem with consumption as a sparse COO ``(n, m, K)`` tensor."""
        cons = self.consumption
        if not isinstance(cons, FactorisedConsumption):
            return self
        n, m = self.revenue.shape
        parts_i, parts_v = [], []
        weight = cons.weight if cons.weight is not None else torch.ones_like(self.revenue)
        for k in range(cons.num_resources):
            vals = weight * cons.item_cost[k][None, :] * cons.segment_mask[k][cons.segment][:, None]
            ij = (vals != 0).nonzero().T
            parts_i.append(
                torch.cat([ij, torch.full((1, ij.shape[1]), k, dtype=ij.dtype, device=ij.device)])
            )
            parts_v.append(vals[ij[0], ij[1]])
        idx = torch.cat(parts_i, dim=1)
        sparse = torch.sparse_coo_tensor(
            idx, torch.cat(parts_v), (n, m, cons.num_resources), check_invariants=False
        ).coalesce()
        return AllocationProblem(self.revenue, self.budget, sparse)

    def dense_consumption(self) -> torch.Tensor:
        """Consumption as a dense ``(n, m, K)`` tensor (small problems only: tests, references)."""
        cons = self.consumption
        if isinstance(cons, FactorisedConsumption):
            weight = cons.weight if cons.weight is not None else torch.ones_like(self.revenue)
            return (
                weight[:, :, None]
                * cons.item_cost.T[None, :, :]
                * cons.segment_mask.T[cons.segment][:, None, :]
            )
        return cons.to_dense()
