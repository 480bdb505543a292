"""Thousands of resources (issue #44): the L-BFGS-B path, the segment x item-subset instances,
the vectorised sparse form and the factorised cells, against HiGHS on small instances."""

from __future__ import annotations

import pytest
import torch

from eventbus.errors import SolverError
from eventbus.solver import AllocationProblem, FactorisedConsumption, generate_problem, solve
from eventbus.solver._dual import NEWTON_MAX_RESOURCES
from eventbus.solver._highs import solve_with_highs
from eventbus.solver._kernel import Partition
from eventbus.solver._lbfgs import mean_coefficients, uses_lbfgs
from eventbus.solver._segments import generate_segment_problem


def _certified(problem: AllocationProblem, gap: float) -> float:
    """Solve with L-BFGS-B steps; check the certificate against HiGHS and the repaired primal
    against the budgets; return the primal value."""
    result = solve(problem, gap=gap, device="cpu", method="lbfgs", keep_allocation=True)
    optimum = solve_with_highs(problem, solver="ipm", gap=1e-9).objective
    assert result.converged and result.gap <= gap
    # the LP optimum lies between the primal found and the dual bound, both within the gap
    assert result.primal_value <= optimum * (1 + 1e-6)
    assert result.dual_value >= optimum * (1 - 1e-6)
    assert (result.dual_value - optimum) / result.dual_value <= gap
    x = result.allocation
    assert x is not None and float(x.min()) >= 0 and float(x.sum(1).max()) <= 1 + 1e-6
    usage = torch.einsum("ij,ijk->k", x.double(), problem.dense_consumption().double())
    assert bool((usage <= problem.budget.double() * (1 + 1e-6)).all())
    assert bool((result.usage <= problem.budget.double() * (1 + 1e-9)).all())
    return result.primal_value


@pytest.mark.parametrize("sparse", [False, True])
def test_lbfgs_against_highs_on_segment_instances(sparse: bool) -> None:
    problem = generate_segment_problem(600, 12, 301, num_segments=10, seed=3, sparse=sparse)
    _certified(problem, 1e-3)


def test_lbfgs_both_forms_agree_to_the_gap() -> None:
    problem = generate_segment_problem(400, 10, 121, num_segments=6, seed=4)
    a = _certified(problem, 1e-3)
    b = _certified(problem.to_sparse(), 1e-3)
    assert abs(a - b) <= 2e-3 * abs(a)


def test_lbfgs_on_the_coupon_family_matches_newton() -> None:
    problem = generate_problem(500, 15, 40, seed=2, mixed=True)
    newton = solve(problem, gap=1e-4, device="cpu", method="newton")
    lbfgs = solve(problem, gap=1e-3, device="cpu", method="lbfgs")
    assert newton.converged and lbfgs.converged
    # both bracket the optimum to the gap: their bounds overlap
    assert lbfgs.primal_value <= newton.dual_value and newton.primal_value <= lbfgs.dual_value


def test_auto_takes_lbfgs_above_the_newton_limit() -> None:
    big = generate_segment_problem(200, 8, NEWTON_MAX_RESOURCES + 1, num_segments=4, seed=1)
    small = generate_problem(50, 5, 3, seed=0)
    assert uses_lbfgs(big, "auto") and not uses_lbfgs(small, "auto")
    assert uses_lbfgs(small, "lbfgs") and not uses_lbfgs(big, "newton")
    result = solve(big, gap=1e-3, device="cpu")  # a K x K Newton metric would be 4,097^2
    assert result.converged and result.gap <= 1e-3


def test_segment_instances_have_the_documented_rows() -> None:
    problem = generate_segment_problem(300, 20, 1001, num_segments=10, seed=0)
    cons = problem.consumption
    assert isinstance(cons, FactorisedConsumption)
    assert cons.row_weight is not None
    assert cons.row_weight[:501] == ("redemption",) * 501
    assert cons.row_weight[501:] == ("count",) * 500
    sparse = problem.to_sparse().consumption
    assert isinstance(sparse, torch.Tensor)
    # three rows at most per (user, item): the global budget, one budget, one inventory
    per_row = torch.bincount(sparse.indices()[0] * 20 + sparse.indices()[1])
    assert int(per_row.max()) <= 3
    again = generate_segment_problem(300, 20, 1001, num_segments=10, seed=0)
    assert torch.equal(again.budget, problem.budget)
    with pytest.raises(SolverError, match="num_resources must be a positive integer; got 0"):
        generate_segment_problem(10, 5, 0)


@pytest.mark.parametrize("mixed", [False, True])
def test_vectorised_to_sparse_matches_the_rows(mixed: bool) -> None:
    problem = generate_problem(120, 9, 25, seed=6, mixed=mixed)
    cons = problem.consumption
    assert isinstance(cons, FactorisedConsumption)
    dense = torch.stack([cons.row(k) for k in range(cons.num_resources)], dim=2)
    sparse = problem.to_sparse().consumption
    assert isinstance(sparse, torch.Tensor) and sparse.is_coalesced()
    assert torch.equal(sparse.to_dense(), dense)
    assert bool((sparse.values() != 0).all())


def test_factorised_cells_match_the_dense_products() -> None:
    problem = generate_segment_problem(500, 12, 201, num_segments=8, seed=2)
    part = Partition(problem, 64, 4)
    assert part._f.cells is not None
    gen = torch.Generator().manual_seed(0)
    lam = torch.rand(201, generator=gen, dtype=torch.float64) * 0.05
    inv = torch.rand(201, generator=gen, dtype=torch.float64)
    a, pa = part.evaluate(lam, 0.1), part.primal(inv)
    part._f.cells = None  # the dense products
    b, pb = part.evaluate(lam, 0.1), part.primal(inv)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(pa, pb, rtol=1e-12, atol=1e-9)


def test_mean_coefficients_agree_across_forms() -> None:
    problem = generate_segment_problem(200, 10, 61, num_segments=5, seed=5)
    torch.testing.assert_close(
        mean_coefficients(problem), mean_coefficients(problem.to_sparse()), equal_nan=True
    )


# -- hostile inputs ---------------------------------------------------------------------------


def _with_budget(problem: AllocationProblem, budget: torch.Tensor) -> AllocationProblem:
    return AllocationProblem(problem.revenue, budget, problem.consumption)


def test_empty_resource_rows_get_a_zero_dual() -> None:
    problem = generate_segment_problem(300, 10, 101, num_segments=5, seed=7, sparse=True)
    cons = problem.consumption
    assert isinstance(cons, torch.Tensor)
    # two more resources that nothing consumes
    wide = torch.sparse_coo_tensor(
        cons.indices(), cons.values(), (300, 10, 103), check_invariants=True
    ).coalesce()
    budget = torch.cat([problem.budget, torch.tensor([5.0, 1e-6])])
    result = solve(AllocationProblem(problem.revenue, budget, wide), gap=1e-3, method="lbfgs")
    assert result.converged and float(result.duals[-2:].abs().max()) == 0.0


def test_budgets_nothing_fits_in_give_a_feasible_and_honest_answer() -> None:
    # budgets a billionth of any coefficient: feasible (x = 0 is), an optimum near 0, where a
    # relative gap is out of reach: the answer stays feasible, says so, and ends
    problem = generate_segment_problem(300, 10, 101, num_segments=5, seed=8)
    tiny = _with_budget(problem, torch.full((101,), 1e-9))
    result = solve(tiny, gap=1e-3, device="cpu", method="lbfgs", max_iterations=300)
    assert bool((result.usage <= tiny.budget.double() * (1 + 1e-9)).all())
    # (HiGHS's tolerances are absolute: it reports 0 here)
    assert 0 <= result.primal_value <= result.dual_value < 1e-4
    assert result.converged == (result.gap <= 1e-3)


def test_a_zero_budget_is_refused_with_its_fix() -> None:
    problem = generate_segment_problem(50, 5, 11, num_segments=3, seed=0)
    zero = problem.budget.clone()
    zero[4] = 0.0
    with pytest.raises(SolverError, match=r"budget must be positive; got a minimum of 0\.0"):
        _with_budget(problem, zero)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_bad_sparse_coefficients_are_refused(bad: float) -> None:
    problem = generate_segment_problem(50, 5, 11, num_segments=3, seed=0, sparse=True)
    cons = problem.consumption
    assert isinstance(cons, torch.Tensor)
    vals = cons.values().clone()
    vals[7] = bad
    broken = torch.sparse_coo_tensor(
        cons.indices(), vals, cons.shape, check_invariants=True
    ).coalesce()
    with pytest.raises(SolverError, match="consumption values must be"):
        AllocationProblem(problem.revenue, problem.budget, broken)


def test_bad_factorised_tables_and_method_are_refused() -> None:
    problem = generate_segment_problem(50, 5, 11, num_segments=3, seed=0)
    cons = problem.consumption
    assert isinstance(cons, FactorisedConsumption)
    cost = cons.item_cost.clone()
    cost[3, 1] = float("inf")
    with pytest.raises(SolverError, match="item_cost must be finite"):
        FactorisedConsumption(
            cost, cons.segment_mask, cons.segment, weights=cons.weights, row_weight=cons.row_weight
        )
    with pytest.raises(SolverError, match="method must be one of 'auto', 'newton', 'lbfgs'"):
        solve(problem, method="bfgs")


def test_a_sparse_sample_is_the_factorised_sample() -> None:
    from eventbus.solver._sample import sample_users, wants_sample

    problem = generate_segment_problem(400, 6, 2049, num_segments=8, seed=9)
    a = sample_users(problem, 50)
    b = sample_users(problem.to_sparse(), 50)
    assert torch.equal(a.revenue, b.revenue) and torch.equal(a.budget, b.budget)
    sparse_b = b.consumption
    assert isinstance(sparse_b, torch.Tensor) and sparse_b.is_coalesced()
    assert torch.equal(a.to_sparse().consumption.to_dense(), sparse_b.to_dense())
    # a sparse problem samples only where L-BFGS-B steps run (thousands of resources)
    assert not wants_sample(generate_problem(9000, 20, 5, seed=0, sparse=True))
