"""The sampled warm start of large factorised problems: the sample itself, fewer passes over the
data, the same certified optimum, and a rare segment the sample misses."""

from __future__ import annotations

import pytest
import torch

import eventbus.solver._sample as _sample
from eventbus.solver import AllocationProblem, FactorisedConsumption, generate_problem, solve
from eventbus.solver._sample import sample_users, wants_sample


@pytest.fixture
def small_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1,000-user samples, taken from 8,000 users up (at m = 20): the path of a 1e8 problem on a
    # problem a unit test can afford (200-user samples are too noisy to save passes)
    monkeypatch.setattr(_sample, "SAMPLE_ENTRIES", 20_000)
    monkeypatch.setattr(_sample, "SAMPLE_MIN_USERS", 1000)


def test_sample_users_scales_budgets_and_keeps_rows() -> None:
    p = generate_problem(1000, 6, 7, seed=1, mixed=True)
    s = sample_users(p, 100)
    assert (s.num_users, s.num_items, s.num_resources) == (100, 6, 7)
    torch.testing.assert_close(s.budget, p.budget * 0.1)
    again = sample_users(p, 100)
    assert torch.equal(again.revenue, s.revenue)  # a fixed seed: the same sample every time
    # every sampled user is a user of the problem, with its own revenue, segment and weights
    cons, sub = p.consumption, s.consumption
    assert isinstance(cons, FactorisedConsumption) and isinstance(sub, FactorisedConsumption)
    assert sub.row_weight == cons.row_weight
    idx = (s.revenue[:, None, :] == p.revenue[None, :, :]).all(2).float().argmax(1)
    assert bool((idx.diff() > 0).all())  # distinct users, in the problem's order
    assert torch.equal(sub.segment, cons.segment[idx])
    assert torch.equal(sub.weights["redemption"], cons.weights["redemption"][idx])
    whole = sample_users(p, 5000)  # more than there are: every user, budgets unchanged
    assert whole.num_users == 1000 and torch.equal(whole.budget, p.budget)


def test_only_large_factorised_problems_are_sampled(small_samples: None) -> None:
    assert wants_sample(generate_problem(8000, 20, 5, seed=0))
    assert not wants_sample(generate_problem(7999, 20, 5, seed=0))
    assert not wants_sample(generate_problem(8000, 20, 5, seed=0, sparse=True))


@pytest.mark.parametrize("mixed", [False, True], ids=["single", "mixed"])
def test_sampled_start_same_optimum_fewer_passes(small_samples: None, mixed: bool) -> None:
    problem = generate_problem(8000, 20, 15, seed=2, mixed=mixed)
    sampled = solve(problem, gap=1e-4, device="cpu", keep_allocation=True)
    cold = solve(problem, gap=1e-4, device="cpu", sample_start=False)
    assert sampled.converged and cold.converged
    assert sampled.evaluations < cold.evaluations
    # both certificates bracket the same optimum
    assert sampled.primal_value <= cold.dual_value * (1 + 1e-9)
    assert cold.primal_value <= sampled.dual_value * (1 + 1e-9)
    x = sampled.allocation
    assert x is not None
    usage = torch.einsum("ij,ijk->k", x.double(), problem.dense_consumption().double())
    assert bool((usage <= problem.budget.double() * (1 + 1e-9)).all())


def test_a_rare_segment_the_sample_misses_still_prices_its_budget(small_samples: None) -> None:
    # resource 1 is segment 0's budget: leave 3 users in segment 0 and give them a budget of a
    # hundredth of what they could use; the 1,000-user sample of 8,000 misses all 3
    p = generate_problem(8000, 20, 10, seed=3)
    cons = p.consumption
    assert isinstance(cons, FactorisedConsumption) and cons.segment_mask[1].tolist()[0] == 1.0
    segment = torch.where(cons.segment == 0, 1, cons.segment)
    segment[[5, 1700, 7999]] = 0
    moved = FactorisedConsumption(
        cons.item_cost, cons.segment_mask, segment, cons.weights["weight"]
    )
    greedy = float(moved.row(1)[[5, 1700, 7999]].amax(1).sum())
    budget = p.budget.clone()
    budget[1] = 0.01 * greedy
    problem = AllocationProblem(p.revenue, budget, moved)
    sample = sample_users(problem, _sample.sample_size(problem))
    assert isinstance(sample.consumption, FactorisedConsumption)
    assert not bool((sample.consumption.segment == 0).any())
    result = solve(problem, gap=1e-4, device="cpu", keep_allocation=True)
    cold = solve(problem, gap=1e-4, device="cpu", sample_start=False)
    assert cold.duals[1] > 0  # the budget binds
    assert result.converged and result.duals[1] > 0
    assert result.primal_value <= cold.dual_value * (1 + 1e-9)
    assert cold.primal_value <= result.dual_value * (1 + 1e-9)
    assert float(result.usage[1]) <= float(budget[1]) * (1 + 1e-9)
