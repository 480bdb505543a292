"""Seeded coupon-allocation instances: budgets, segment budgets, category budgets, inventories."""

from __future__ import annotations

import torch

from eventbus.errors import SolverError
from eventbus.solver._problem import AllocationProblem, FactorisedConsumption

__all__ = ["generate_problem"]


def generate_problem(
    num_users: int,
    num_items: int,
    num_resources: int,
    *,
    seed: int = 0,
    num_segments: int = 8,
    sparse: bool = False,
    mixed: bool = False,
    dtype: torch.dtype = torch.float32,
) -> AllocationProblem:
    """A random coupon-allocation problem, identical for identical arguments.

    Items are coupons with a face value; user ``i`` redeems coupon ``j`` with probability
    ``weight[i, j]`` and then spends ``revenue[i, j]`` more. Resource rows, in order: one global
    budget on expected coupon spend (``face value * redemption probability``), then about a third
    each of per-segment budgets, per-category budgets and per-coupon inventories (expected
    redemptions). Budgets are 30-80 % of what the unconstrained greedy choice would use, so most
    of them bind.

    With ``mixed=True`` the rows mix their coefficients as real coupon problems do: budgets count
    expected spend (``face value * redemption probability``, the weight ``"redemption"``) while
    inventories count coupons (``"count"``, coefficient 1), and every other inventory applies to
    one user segment only. Same revenue, probabilities and segments as ``mixed=False``.

    Args:
        num_users: ``n``.
        num_items: ``m``.
        num_resources: ``K`` (at least 1).
        seed: random seed.
        num_segments: user segments (``G``), capped at ``num_users``.
        sparse: return consumption as a sparse COO tensor instead of the factorised form.
        mixed: inventories count coupons (coefficient 1) while budgets count expected spend.
        dtype: floating dtype of the data.

    Returns:
        An :class:`AllocationProblem` on the CPU.

    Raises:
        SolverError: a size is not positive.

    Example:
        >>> p = generate_problem(100, 10, 4, seed=7)
        >>> (p.num_users, p.num_items, p.num_resources)
        (100, 10, 4)
    """
    for name, v in (
        ("num_users", num_users),
        ("num_items", num_items),
        ("num_resources", num_resources),
        ("num_segments", num_segments),
    ):
        if not isinstance(v, int) or v < 1:
            msg = f"{name} must be a positive integer; got {v!r}"
            raise SolverError(msg)
    n, m, k_num = num_users, num_items, num_resources
    g_num = min(num_segments, n)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen, dtype=torch.float32)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    face = torch.tensor([2.0, 5.0, 10.0, 20.0, 50.0])[torch.randint(0, 5, (m,), generator=gen)]
    lift = 0.5 + rand(m)
    segment = torch.randint(0, g_num, (n,), generator=gen)
    seg_spend = 0.5 + 1.5 * rand(g_num)
    spend = seg_spend[segment] * torch.exp(0.6 * randn(n))  # user base spend
    affinity = randn(g_num, m) * 0.3
    revenue = torch.empty(n, m, dtype=torch.float32)
    weight = torch.empty(n, m, dtype=torch.float32)
    step = max(1, (1 << 22) // m)
    for a in range(0, n, step):  # chunked: bounded temporaries for huge instances
        b = min(a + step, n)
        noise = randn(b - a, m)
        logit = affinity[segment[a:b]] + 0.8 * noise - 0.5
        weight[a:b] = torch.sigmoid(logit)
        revenue[a:b] = (
            spend[a:b, None]
            * lift[None, :]
            * torch.sqrt(face)[None, :]
            * torch.exp(0.4 * randn(b - a, m))
            - 0.3 * face[None, :]
        )
    item_cost = torch.zeros(k_num, m)
    mask = torch.zeros(k_num, g_num)
    item_cost[0], mask[0] = face, 1.0  # global budget on expected spend
    rest = k_num - 1
    n_seg, n_cat = (rest + 2) // 3, (rest + 1) // 3
    n_inv = rest - n_seg - n_cat
    category = torch.randint(0, max(1, n_cat), (m,), generator=gen)
    for r in range(n_seg):
        row = 1 + r
        item_cost[row] = face
        mask[row, r % g_num] = 1.0
        if r >= g_num:  # more segment rows than segments: restrict to a random item half too
            item_cost[row] *= (rand(m) < 0.5).float()
    for r in range(n_cat):
        row = 1 + n_seg + r
        item_cost[row] = face * (category == r).float()
        mask[row] = 1.0
    order = torch.argsort(lift * torch.sqrt(face), descending=True)
    for r in range(n_inv):
        row = 1 + n_seg + n_cat + r
        item_cost[row, order[r % m]] = 1.0
        mask[row] = 1.0
    if mixed:
        rows = ("redemption",) * (1 + n_seg + n_cat) + ("count",) * n_inv
        for r in range(1, n_inv, 2):  # every other inventory: one segment's users only
            mask[1 + n_seg + n_cat + r] = 0.0
            mask[1 + n_seg + n_cat + r, (r // 2) % g_num] = 1.0
        cons = FactorisedConsumption(
            item_cost.to(dtype),
            mask.to(dtype),
            segment,
            weights={"redemption": weight.to(dtype)},
            row_weight=rows,
        )
    else:  # one weight for every row (the weight named "weight")
        cons = FactorisedConsumption(item_cost.to(dtype), mask.to(dtype), segment, weight.to(dtype))
    budget = _budgets(revenue, cons, rand(k_num))
    problem = AllocationProblem(revenue.to(dtype), budget.to(dtype), cons)
    return problem.to_sparse() if sparse else problem


def _budgets(revenue: torch.Tensor, cons: FactorisedConsumption, u: torch.Tensor) -> torch.Tensor:
    """30-80 % of each resource's use under the greedy (unconstrained) choice."""
    n, m = revenue.shape
    groups = cons.groups
    qs = [torch.zeros(cons.num_segments, m, dtype=torch.float64) for _ in groups]
    step = max(1, (1 << 22) // m)
    greedy = torch.zeros(cons.num_resources, dtype=torch.float64)
    for a in range(0, n, step):
        b = min(a + step, n)
        best = revenue[a:b].argmax(1)
        take = (revenue[a:b].gather(1, best[:, None]).squeeze(1) > 0).double()
        for q, (name, _) in zip(qs, groups):
            w = cons.weight_of(name, a, b)
            got = take if w is None else w.gather(1, best[:, None]).squeeze(1).double() * take
            q.index_put_((cons.segment[a:b], best), got, accumulate=True)
    for q, (_, rows) in zip(qs, groups):
        ic, sm = cons.item_cost[rows].double(), cons.segment_mask[rows].double()
        greedy[rows] = ((ic @ q.T) * sm).sum(1)
    fallback = float(greedy[greedy > 0].mean()) if bool((greedy > 0).any()) else 1.0
    greedy = torch.where(greedy > 0, greedy, torch.full_like(greedy, fallback))
    return (0.3 + 0.5 * u.double()) * greedy
