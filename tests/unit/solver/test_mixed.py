"""Mixed rows in the factorised form: budgets count expected spend, inventories count coupons."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
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
    solve,
)
from eventbus.solver._highs import solve_with_highs
from eventbus.solver._kernel import Partition

CASES = [(80, 8, 7, 0), (250, 12, 16, 1), (400, 20, 31, 2)]


def _usage(problem: AllocationProblem, x: torch.Tensor) -> torch.Tensor:
    return torch.einsum("ij,ijk->k", x.double(), problem.dense_consumption().double())


def test_mixed_rows_really_mix() -> None:
    p = generate_problem(50, 6, 10, seed=0, mixed=True)
    cons = p.consumption
    assert isinstance(cons, FactorisedConsumption)
    assert set(cons.row_weight or ()) == {"redemption", "count"}
    k = (cons.row_weight or ()).index("count")
    dense = p.dense_consumption()
    # an inventory row counts 1 per coupon given, whatever the redemption probability
    assert set(dense[:, :, k].unique().tolist()) <= {0.0, 1.0}
    assert dense[:, :, 0].unique().numel() > 10  # the global budget: face x probability


@pytest.mark.parametrize(("n", "m", "k", "seed"), CASES)
def test_mixed_against_highs(n: int, m: int, k: int, seed: int) -> None:
    problem = generate_problem(n, m, k, seed=seed, mixed=True)
    result = solve(problem, gap=1e-4, device="cpu", keep_allocation=True)
    optimum = solve_with_highs(problem, solver="simplex").objective
    assert result.converged and result.gap <= 1e-4
    assert result.primal_value <= optimum * (1 + 1e-7)
    assert result.dual_value >= optimum * (1 - 1e-7)
    assert (optimum - result.primal_value) / optimum <= 1e-4
    x = result.allocation
    assert x is not None and float(x.min()) >= 0 and float(x.sum(1).max()) <= 1 + 1e-6
    # no budget or inventory exceeded after the repair
    assert bool((_usage(problem, x) <= problem.budget.double() * (1 + 1e-9)).all())
    assert bool((result.usage <= problem.budget.double()).all())


@pytest.mark.parametrize(("n", "m", "k", "seed"), CASES[:2])
def test_sparse_and_factorised_forms_agree(n: int, m: int, k: int, seed: int) -> None:
    fact = generate_problem(n, m, k, seed=seed, mixed=True)
    sparse = fact.to_sparse()
    assert torch.allclose(sparse.dense_consumption(), fact.dense_consumption())
    a = solve(fact, gap=1e-5, device="cpu")
    b = solve(sparse, gap=1e-5, device="cpu")
    assert a.converged and b.converged
    # both certificates bracket the same optimum
    assert a.primal_value <= b.dual_value * (1 + 1e-7) and b.primal_value <= a.dual_value * (
        1 + 1e-7
    )
    assert a.primal_value == pytest.approx(b.primal_value, rel=2e-5)


def test_metric_and_usage_match_the_sparse_pass() -> None:
    # the factorised pass's gradient and Newton metric, group pairs included, equal the general
    # (sparse) pass's at a warm temperature (no user is left out of the metric there)
    fact = generate_problem(120, 7, 13, seed=4, mixed=True, dtype=torch.float64)
    lam = torch.rand(13, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.05
    rows = []
    for prob in (fact, fact.to_sparse()):
        part = Partition(prob, 16, 2)
        rows.append(part.evaluate(lam, 5.0, stride=1).sum(0))
    a, b = rows
    assert float(a[3]) == float(b[3]) == 120  # every user in the metric
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_decide_agrees_across_forms() -> None:
    p = generate_problem(64, 9, 12, seed=3, mixed=True)
    cons = p.consumption
    assert isinstance(cons, FactorisedConsumption)
    lam = torch.rand(12, dtype=torch.float64)
    reduced = p.revenue.double() - p.dense_consumption().double() @ lam
    want = torch.where(reduced.max(1).values >= 0, reduced.argmax(1), -1)
    assert torch.equal(decide(lam, p.revenue, cons), want)
    assert torch.equal(decide(lam, p.revenue, p.to_sparse().consumption), want)


@pytest.mark.parametrize("suffix", [".npz", ".pt"])
def test_file_round_trip(tmp_path: Path, suffix: str) -> None:
    p = generate_problem(30, 5, 10, seed=2, mixed=True)
    save_problem(p, tmp_path / f"p{suffix}")
    q = load_problem(tmp_path / f"p{suffix}")
    assert isinstance(q.consumption, FactorisedConsumption)
    assert q.consumption.row_weight == p.consumption.row_weight  # type: ignore[union-attr]
    assert torch.equal(q.dense_consumption(), p.dense_consumption())


def test_single_weight_files_keep_the_old_format(tmp_path: Path) -> None:
    save_problem(generate_problem(10, 4, 3, seed=1), tmp_path / "p.npz")
    with np.load(tmp_path / "p.npz") as data:
        assert "row_weight" not in data.files and "weight" in data.files


def test_file_with_an_unknown_row_weight(tmp_path: Path) -> None:
    p = generate_problem(10, 4, 3, seed=1, mixed=True)
    save_problem(p, tmp_path / "p.npz")
    with np.load(tmp_path / "p.npz") as data:
        arrays = {k: data[k] for k in data.files}
    arrays["row_weight"] = np.array(["redemption", "cost", "count"])
    np.savez(tmp_path / "bad.npz", **arrays)
    expect = (
        "row_weight names weights that are not given (known: ['redemption', 'count']); got ['cost']"
    )
    with pytest.raises(SolverError, match=re.escape(expect)):
        load_problem(tmp_path / "bad.npz")


def _seg(n: int = 2) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.long)


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [
        (
            {"weights": {"a": torch.ones(2, 3), "b": torch.ones(2, 3)}},
            "row_weight must say which weight each resource counts in when several are given; "
            "got weights ['a', 'b'] and no row_weight",
        ),
        (
            {"weights": {"count": torch.ones(2, 3)}},
            "weight names must match ^[a-z][a-z0-9_]*$ and not be 'count'",
        ),
        ({"row_weight": ("count",)}, "row_weight must have one name per resource; got 1 names"),
        (
            {"weights": {"a": torch.ones(3, 3)}, "row_weight": ("a", "count")},
            "weights['a'] must have shape (num_users, num_items); got (3, 3)",
        ),
        (
            {"weights": {"a": -torch.ones(2, 3)}, "row_weight": ("a", "count")},
            "weights['a'] must be non-negative",
        ),
    ],
)
def test_invalid_mixed_consumption(kwargs: dict[str, object], expect: str) -> None:
    with pytest.raises(SolverError, match=re.escape(expect)):
        FactorisedConsumption(torch.ones(2, 3), torch.ones(2, 1), _seg(), **kwargs)  # type: ignore[arg-type]
