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
SAMPLE_SEED = 0x5A3F  # fixed: a local and a distributed solve draw the same sample


def sample_size(problem: AllocationProblem) -> int:
    """Users in the warm-start sample of ``problem``."""
    return max(SAMPLE_MIN_USERS, SAMPLE_ENTRIES // max(1, problem.num_items))


def wants_sample(problem: AllocationProblem) -> bool:
    """Whether ``problem`` is factorised and large enough for a sampled warm start to pay."""
    return isinstance(
        problem.consumption, FactorisedConsumption
    ) and problem.num_users >= SAMPLE_ABOVE * sample_size(problem)


def sample_users(
    problem: AllocationProblem, count: int, seed: int = SAMPLE_SEED
) -> AllocationProblem:
    """``count`` users of a factorised ``problem`` drawn without replacement (in their order),
    every budget scaled by ``count / num_users``."""
    cons = problem.consumption
    assert isinstance(cons, FactorisedConsumption)
    n = problem.num_users
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randperm(n, generator=gen)[: min(count, n)].sort().values
    idx = idx.to(problem.revenue.device)
    sub = FactorisedConsumption(
        cons.item_cost,
        cons.segment_mask,
        cons.segment.index_select(0, idx),
        weights={k: v.index_select(0, idx) for k, v in cons.weights.items()},
        row_weight=cons.row_weight,
    )
    share = idx.numel() / max(1, n)
    return AllocationProblem(problem.revenue.index_select(0, idx), problem.budget * share, sub)
