"""The problem model, its file format and per-request decisions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from eventbus.errors import SolverError
from eventbus.solver import (
    AllocationProblem,
    FactorisedConsumption,
    decide,
    generate_problem,
    load_problem,
    save_problem,
)


def _cons(n: int = 3, m: int = 2, k: int = 1, g: int = 1) -> FactorisedConsumption:
    return FactorisedConsumption(
        torch.ones(k, m), torch.ones(k, g), torch.zeros(n, dtype=torch.long)
    )


def test_negative_budget_names_value_and_fix() -> None:
    with pytest.raises(
        SolverError, match=re.escape("budget must be positive; got a minimum of -1.0; clip it")
    ):
        AllocationProblem(torch.rand(3, 2), torch.tensor([-1.0]), _cons())


def test_solver_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="revenue must be finite"):
        AllocationProblem(torch.tensor([[float("nan"), 1.0]] * 3), torch.tensor([1.0]), _cons())


@pytest.mark.parametrize(
    ("build", "expect"),
    [
        (
            lambda: AllocationProblem(torch.rand(4, 2), torch.tensor([1.0]), _cons()),
            "consumption must match revenue's shape (4 users, 2 items)",
        ),
        (
            lambda: AllocationProblem(torch.rand(3, 2), torch.tensor([1.0, 2.0]), _cons()),
            "budget must have one entry per resource; got 2 entries for 1 resources",
        ),
        (
            lambda: FactorisedConsumption(torch.ones(1, 2), torch.ones(1, 2), torch.tensor([0, 2])),
            "segment values must lie in [0, 2)",
        ),
        (
            lambda: FactorisedConsumption(
                -torch.ones(1, 2), torch.ones(1, 1), torch.zeros(2, dtype=torch.long)
            ),
            "item_cost must be non-negative",
        ),
        (
            lambda: AllocationProblem(torch.rand(3, 2).long(), torch.tensor([1.0]), _cons()),
            "revenue must be a floating-point tensor; got dtype torch.int64",
        ),
        (
            lambda: AllocationProblem(torch.rand(3, 2), torch.tensor([1.0]), torch.ones(3, 2, 1)),
            "a tensor consumption must be a sparse COO tensor",
        ),
    ],
)
def test_invalid_problems(build, expect: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SolverError, match=re.escape(expect)):
        build()


def test_generator_is_deterministic_and_budgets_bind() -> None:
    a, b = generate_problem(300, 12, 9, seed=5), generate_problem(300, 12, 9, seed=5)
    c = generate_problem(300, 12, 9, seed=6)
    assert torch.equal(a.revenue, b.revenue) and torch.equal(a.budget, b.budget)
    assert not torch.equal(a.revenue, c.revenue)
    assert a.num_resources == 9 and a.consumption.num_segments == 8  # type: ignore[union-attr]


def test_sparse_form_equals_factorised() -> None:
    p = generate_problem(40, 6, 7, seed=1)
    assert torch.allclose(p.to_sparse().dense_consumption(), p.dense_consumption())


@pytest.mark.parametrize("suffix", [".npz", ".pt"])
@pytest.mark.parametrize("sparse", [False, True])
def test_file_round_trip(tmp_path: Path, suffix: str, sparse: bool) -> None:
    p = generate_problem(20, 5, 4, seed=2, sparse=sparse)
    save_problem(p, tmp_path / f"p{suffix}")
    q = load_problem(tmp_path / f"p{suffix}")
    assert torch.equal(q.revenue, p.revenue) and torch.equal(q.budget, p.budget)
    assert torch.allclose(q.dense_consumption(), p.dense_consumption())


def test_file_missing_arrays(tmp_path: Path) -> None:
    import numpy as np

    np.savez(tmp_path / "bad.npz", revenue=np.ones((2, 2), dtype=np.float32))
    with pytest.raises(SolverError, match=re.escape("misses arrays: budget; either item_cost")):
        load_problem(tmp_path / "bad.npz")


def test_decide_factorised_sparse_and_dense_agree() -> None:
    p = generate_problem(64, 9, 6, seed=3)
    lam = torch.rand(6, dtype=torch.float64)
    cons = p.consumption
    assert isinstance(cons, FactorisedConsumption)
    a = decide(lam, p.revenue, cons)
    b = decide(lam, p.revenue, p.to_sparse().consumption)
    c = decide(lam, p.revenue, p.dense_consumption())
    reduced = p.revenue.double() - p.dense_consumption().double() @ lam
    want = torch.where(reduced.max(1).values >= 0, reduced.argmax(1), -1)
    assert torch.equal(a, want) and torch.equal(b, want) and torch.equal(c, want)


def test_decide_none_when_every_reduced_cost_is_negative() -> None:
    cons = FactorisedConsumption(
        torch.tensor([[1.0, 4.0]]), torch.ones(1, 1), torch.zeros(2, dtype=torch.long)
    )
    assert decide(torch.tensor([0.5]), torch.tensor([[1.0, 2.8], [0.2, 0.1]]), cons).tolist() == [
        1,
        -1,
    ]
    assert decide(torch.tensor([10.0]), torch.tensor([[1.0, 2.8], [0.2, 0.1]]), cons).tolist() == [
        -1,
        -1,
    ]


def test_decide_rejects_bad_duals() -> None:
    with pytest.raises(
        SolverError, match=re.escape("duals must be a finite, non-negative (1,) tensor")
    ):
        decide(torch.tensor([-1.0]), torch.rand(2, 2), _cons(2, 2))
