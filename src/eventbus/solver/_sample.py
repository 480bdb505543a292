"""A warm start for large factorised problems: the duals of a random sample of the users.

The duals price a resource by how scarce it is per user, so a few thousand users drawn at random,
with every budget scaled by the share of users drawn, price the resources nearly as the whole
population does. Solving that sample costs a small fraction of one pass over a large problem, and
the full solve then starts near its optimum at the sample's last temperature: at 1e8 variables
(1e6 users, 100 items, K = 100) it needs 4-6 passes over the data instead of about 20.
"""

from __future__ import annotations

import torch

from eventbus.solver._factorised import FactorisedConsumption
from eventbus.solver._problem import AllocationProblem

__all__ = ["SAMPLE_ENTRIES", "sample_users", "wants_sample"]

SAMPLE_ENTRIES = 1 << 20  # (user, item) entries in the sample: about 0.3 s of solving
SAMPLE_MIN_USERS = 2000  # fewer users price segment-sized budgets too noisily
SAMPLE_ABOVE = 8  # sample only problems at least this many times the sample's size
SAMPLE_USERS_PER_RESOURCE = 20  # above the Newton limit: no sample with fewer users a resource
SAMPLE_SEED = 0x5A3F  # fixed: a local and a distributed solve draw the same sample


def sample_size(problem: AllocationProblem) -> int:
    """Users in the warm-start sample of ``problem``."""
    return max(SAMPLE_MIN_USERS, SAMPLE_ENTRIES // max(1, problem.num_items))


def wants_sample(problem: AllocationProblem) -> bool:
    """Whether ``problem`` is large enough for a sampled warm start to pay: factorised, or
    sparse with more resources than the Newton steps take (L-BFGS-B needs more passes)."""
    from eventbus.solver._dual import NEWTON_MAX_RESOURCES

    many = problem.num_resources > NEWTON_MAX_RESOURCES
    if not many and not isinstance(problem.consumption, FactorisedConsumption):
        return False
    # with thousands of resources a sample with few users per resource prices them by noise
    if many and sample_size(problem) < SAMPLE_USERS_PER_RESOURCE * problem.num_resources:
        return False
    return problem.num_users >= SAMPLE_ABOVE * sample_size(problem)


def sample_users(
    problem: AllocationProblem, count: int, seed: int = SAMPLE_SEED
) -> AllocationProblem:
    """``count`` users of ``problem`` drawn without replacement (in their order), every budget
    scaled by ``count / num_users``."""
    cons = problem.consumption
    n = problem.num_users
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randperm(n, generator=gen)[: min(count, n)].sort().values
    idx = idx.to(problem.revenue.device)
    share = idx.numel() / max(1, n)
    if not isinstance(cons, FactorisedConsumption):
        return AllocationProblem(
            problem.revenue.index_select(0, idx), problem.budget * share, _sparse_rows(cons, idx)
        )
    sub = FactorisedConsumption(
        cons.item_cost,
        cons.segment_mask,
        cons.segment.index_select(0, idx),
        weights={k: v.index_select(0, idx) for k, v in cons.weights.items()},
        row_weight=cons.row_weight,
    )
    return AllocationProblem(problem.revenue.index_select(0, idx), problem.budget * share, sub)


def _sparse_rows(cons: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The entries of users ``idx`` (ascending) of a coalesced sparse ``(n, m, K)`` tensor,
    renumbered ``0 .. len(idx) - 1`` (still coalesced: the order is kept)."""
    n = int(cons.shape[0])
    new = torch.full((n,), -1, dtype=torch.long, device=idx.device)
    new[idx] = torch.arange(idx.numel(), device=idx.device)
    ind, vals = cons.indices(), cons.values()
    user = new.index_select(0, ind[0])
    keep = (user >= 0).nonzero().squeeze(1)
    sub_idx = ind.index_select(1, keep)
    sub_idx[0] = user.index_select(0, keep)
    return torch.sparse_coo_tensor(
        sub_idx,
        vals.index_select(0, keep),
        (idx.numel(), *cons.shape[1:]),
        is_coalesced=True,
        check_invariants=False,
    )
