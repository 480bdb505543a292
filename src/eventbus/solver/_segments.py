"""Seeded instances with thousands of resources: budgets and inventories on item subsets x user
segments, as an online allocation at a large platform's scale has them (issue #44: K = 10,000).

Users, revenue, redemption probabilities and face values are :func:`generate_problem`'s (same
seed, same numbers). The resources, in order:

* one global budget on expected coupon spend (face value x redemption probability);
* half of the rest: a budget on expected spend per (user segment, item category): the items are
  split into ``ceil(budgets / segments)`` categories, and segment ``g``'s budgets cover its
  categories;
* the other half: an inventory (coupons counted, coefficient 1) per (item, segment cluster):
  the segments are split into ``ceil(inventories / items)`` clusters.

Each (user, item) entry then lies in three rows at most (the global budget, its segment's
category budget, its item's inventory for its cluster): about ``3 n m`` nonzeros in the sparse
form, ``K x m`` and ``K x G`` tables in the factorised one. Budgets are 30-80 % of the greedy
choice's use, so most bind; a row that no (user, item) reaches is left empty (its dual is 0).
"""

from __future__ import annotations

import math

import torch

from eventbus.errors import SolverError
from eventbus.solver._factorised import COUNT, FactorisedConsumption
from eventbus.solver._generate import _budgets, generate_problem
from eventbus.solver._problem import AllocationProblem

__all__ = ["generate_segment_problem"]


def _tables(
    face: torch.Tensor, k_num: int, g_num: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """``item_cost (K, m)``, ``segment_mask (K, G)`` and ``row_weight`` of the rows above."""
    m = face.shape[0]
    item_cost = torch.zeros(k_num, m)
    mask = torch.zeros(k_num, g_num)
    item_cost[0], mask[0] = face, 1.0
    n_bud = (k_num - 1) // 2
    n_inv = k_num - 1 - n_bud
    n_cat = max(1, math.ceil(n_bud / g_num))
    category = torch.randperm(m, generator=gen) % n_cat  # balanced categories, random items
    for r in range(n_bud):
        g, c = divmod(r, n_cat)
        item_cost[1 + r] = face * (category == c).float()
        mask[1 + r, g % g_num] = 1.0
    n_clu = max(1, math.ceil(n_inv / m))
    cluster = torch.randperm(g_num, generator=gen) % n_clu
    for r in range(n_inv):
        j, c = divmod(r, n_clu)
        item_cost[1 + n_bud + r, j % m] = 1.0
        mask[1 + n_bud + r] = (cluster == c).float()
    rows = ("redemption",) * (1 + n_bud) + (COUNT,) * n_inv
    return item_cost, mask, rows


def generate_segment_problem(
    num_users: int,
    num_items: int,
    num_resources: int,
    *,
    num_segments: int = 100,
    seed: int = 0,
    sparse: bool = False,
    dtype: torch.dtype = torch.float32,
) -> AllocationProblem:
    """A random instance with budgets and inventories on item subsets x user segments.

    Args:
        num_users: ``n``.
        num_items: ``m``.
        num_resources: ``K`` (at least 1; thousands is the point).
        num_segments: user segments ``G`` (capped at ``num_users``).
        seed: random seed (identical arguments, identical instance).
        sparse: return the consumption as a sparse COO ``(n, m, K)`` tensor.
        dtype: floating dtype of the data.

    Raises:
        SolverError: a size is not a positive integer.

    Example:
        >>> p = generate_segment_problem(500, 20, 301, num_segments=10, seed=1)
        >>> p.num_resources, p.consumption.row_weight[-1]
        (301, 'count')
    """
    for name, v in (("num_resources", num_resources), ("num_segments", num_segments)):
        if not isinstance(v, int) or v < 1:
            msg = f"{name} must be a positive integer; got {v!r}"
            raise SolverError(msg)
    base = generate_problem(
        num_users, num_items, 1, seed=seed, num_segments=num_segments, dtype=torch.float32
    )
    cons = base.consumption
    assert isinstance(cons, FactorisedConsumption)
    g_num = cons.num_segments
    gen = torch.Generator().manual_seed(seed + 1)
    item_cost, mask, rows = _tables(cons.item_cost[0], num_resources, g_num, gen)
    weight = cons.weights["weight"]
    full = FactorisedConsumption(
        item_cost.to(dtype),
        mask.to(dtype),
        cons.segment,
        weights={"redemption": weight.to(dtype)},
        row_weight=rows,
    )
    budget = _budgets(base.revenue, full, torch.rand(num_resources, generator=gen))
    problem = AllocationProblem(base.revenue.to(dtype), budget.to(dtype), full)
    return problem.to_sparse() if sparse else problem
