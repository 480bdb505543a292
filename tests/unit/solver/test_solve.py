"""The dual solver against HiGHS optima: certified gaps, feasibility, determinism, warm starts."""

from __future__ import annotations

import re

import pytest
import torch

from eventbus.errors import SolverError
from eventbus.solver import AllocationProblem, generate_problem, solve
from eventbus.solver._highs import solve_with_highs

CASES = [(60, 8, 4, 0), (200, 10, 12, 1), (400, 25, 30, 2)]


def _check_feasible(problem: AllocationProblem, x: torch.Tensor) -> None:
    x = x.double()
    assert float(x.min()) >= 0
    assert float(x.sum(1).max()) <= 1 + 1e-6
    usage = torch.einsum("ij,ijk->k", x, problem.dense_consumption().double())
    assert bool((usage <= problem.budget.double() * (1 + 1e-9)).all()), (
        usage / problem.budget.double()
    ).max()


@pytest.mark.parametrize("sparse", [False, True], ids=["factorised", "sparse"])
@pytest.mark.parametrize(("n", "m", "k", "seed"), CASES)
def test_gap_against_highs(n: int, m: int, k: int, seed: int, sparse: bool) -> None:
    problem = generate_problem(n, m, k, seed=seed, sparse=sparse)
    result = solve(problem, gap=1e-4, device="cpu", keep_allocation=True)
    optimum = solve_with_highs(problem, solver="simplex").objective
    assert result.converged and result.gap <= 1e-4
    # the certificate brackets the true optimum, and the feasible primal is within 1e-4 of it
    assert result.primal_value <= optimum * (1 + 1e-7)
    assert result.dual_value >= optimum * (1 - 1e-7)
    assert (optimum - result.primal_value) / optimum <= 1e-4
    assert result.allocation is not None
    _check_feasible(problem, result.allocation)
    value = float((result.allocation.double() * problem.revenue.double()).sum())
    assert value == pytest.approx(result.primal_value, rel=1e-5)
    assert bool((result.usage <= problem.budget.double()).all())


def test_float64_problem() -> None:
    problem = generate_problem(150, 10, 8, seed=4, dtype=torch.float64)
    result = solve(problem, gap=1e-6, device="cpu")
    optimum = solve_with_highs(problem, solver="simplex").objective
    assert result.converged
    assert result.dual_value >= optimum * (1 - 1e-10) >= result.primal_value * (1 - 1e-10)


def test_deterministic() -> None:
    problem = generate_problem(500, 20, 10, seed=9)
    a = solve(problem, gap=1e-4, device="cpu")
    b = solve(generate_problem(500, 20, 10, seed=9), gap=1e-4, device="cpu")
    assert torch.equal(a.duals, b.duals)
    assert (a.primal_value, a.dual_value, a.iterations) == (
        b.primal_value,
        b.dual_value,
        b.iterations,
    )


def test_chunking_keeps_the_answer() -> None:
    problem = generate_problem(300, 10, 6, seed=2)
    a = solve(problem, gap=1e-4, device="cpu")
    b = solve(problem, gap=1e-4, device="cpu", chunk_users=7)
    assert b.converged
    assert a.primal_value == pytest.approx(b.primal_value, rel=2e-4)


@pytest.mark.parametrize("sparse", [False, True], ids=["factorised", "sparse"])
def test_warm_start_needs_fewer_iterations(sparse: bool) -> None:
    problem = generate_problem(800, 20, 15, seed=3, sparse=sparse)
    cold = solve(problem, gap=1e-4, device="cpu")
    warm = solve(problem, gap=1e-4, device="cpu", warm_start=cold)
    warm_duals = solve(problem, gap=1e-4, device="cpu", warm_start=cold.duals)
    assert cold.iterations >= 3
    assert warm.converged and warm.iterations < cold.iterations
    assert warm_duals.converged and warm_duals.iterations < cold.iterations
    # a drifted problem (5 % more revenue) still starts well from yesterday's duals
    drifted = AllocationProblem(problem.revenue * 1.05, problem.budget, problem.consumption)
    again = solve(drifted, gap=1e-4, device="cpu", warm_start=cold)
    assert again.converged and again.iterations < solve(drifted, gap=1e-4, device="cpu").iterations


def test_progress_callback_sees_gap_fall() -> None:
    seen = []
    solve(generate_problem(300, 10, 5, seed=1), gap=1e-4, device="cpu", callback=seen.append)
    assert seen and seen[-1].gap <= 1e-4 < seen[0].gap
    assert [p.iteration for p in seen] == list(range(1, len(seen) + 1))


def test_non_binding_budgets_give_zero_duals() -> None:
    problem = generate_problem(100, 5, 3, seed=0)
    loose = AllocationProblem(problem.revenue, problem.budget * 1e6, problem.consumption)
    result = solve(loose, gap=1e-6, device="cpu")
    assert result.converged and float(result.duals.abs().max()) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [
        ({"gap": 0.0}, "gap must lie in (0, 1) (a relative gap such as 1e-4); got 0.0"),
        (
            {"warm_start": torch.zeros(2)},
            "warm_start must be a SolveResult or a (3,) dual tensor; got (2,)",
        ),
        ({"warm_start": -torch.ones(3)}, "warm_start duals must be finite and non-negative"),
        ({"device": "tpu"}, "device must be 'auto', 'cpu' or 'cuda[:N]'; got 'tpu'"),
    ],
)
def test_bad_options(kwargs: dict[str, object], expect: str) -> None:
    with pytest.raises(SolverError, match=re.escape(expect)):
        solve(generate_problem(10, 4, 3), **kwargs)  # type: ignore[arg-type]


def test_cuda_without_cuda_is_an_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SolverError, match="CUDA is not available"):
        solve(generate_problem(10, 4, 3), device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("form", ["factorised", "mixed", "sparse"])
def test_cuda_matches_cpu(form: str) -> None:
    problem = generate_problem(2000, 20, 12, seed=5, mixed=form == "mixed")
    if form == "sparse":
        problem = problem.to_sparse()
    cpu = solve(problem, gap=1e-4, device="cpu")
    gpu = solve(problem, gap=1e-4, device="cuda", keep_allocation=True)
    assert cpu.converged and gpu.converged
    # both certificates bracket the same optimum
    assert gpu.primal_value <= cpu.dual_value * (1 + 1e-6)
    assert cpu.primal_value <= gpu.dual_value * (1 + 1e-6)
    assert gpu.allocation is not None and gpu.allocation.device.type == "cuda"
    assert bool((gpu.usage <= problem.budget.double()).all())
