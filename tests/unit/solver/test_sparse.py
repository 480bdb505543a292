"""The sparse (n, m, K) form's pass: CSR products, exact row-pattern compression, and the
general rows that do not compress."""

from __future__ import annotations

import pytest
import torch

from eventbus.solver import AllocationProblem, generate_problem, solve
from eventbus.solver._highs import solve_with_highs
from eventbus.solver._kernel import HEAD, HESSIAN_SPREAD, Partition, slice_users
from eventbus.solver._sparse import SparsePass


def _check_against_highs(problem: AllocationProblem, gap: float = 1e-4) -> None:
    result = solve(problem, gap=gap, device="cpu", keep_allocation=True)
    optimum = solve_with_highs(problem, solver="simplex").objective
    assert result.converged and result.gap <= gap
    assert result.primal_value <= optimum * (1 + 1e-7)
    assert result.dual_value >= optimum * (1 - 1e-7)
    x = result.allocation
    assert x is not None and float(x.min()) >= 0 and float(x.sum(1).max()) <= 1 + 1e-6
    usage = torch.einsum("ij,ijk->k", x.double(), problem.dense_consumption().double())
    assert bool((usage <= problem.budget.double() * (1 + 1e-9)).all())


def _random_sparse(n: int, m: int, k: int, seed: int, density: float = 0.3) -> AllocationProblem:
    # every entry its own value: no two rows are scalar multiples of one pattern
    gen = torch.Generator().manual_seed(seed)
    dense = torch.rand(n, m, k, generator=gen) * (torch.rand(n, m, k, generator=gen) < density)
    revenue = torch.rand(n, m, generator=gen) * 2 - 0.3
    budget = (0.2 + 0.3 * torch.rand(k, generator=gen)) * dense.sum((0, 1)) / m
    return AllocationProblem(revenue, budget.clamp_min(1e-3), dense.to_sparse())


def _perturbed(problem: AllocationProblem, factor: float) -> AllocationProblem:
    """Every 17th entry that is not its (user, item) row's first, times ``factor``."""
    cons = problem.consumption
    assert isinstance(cons, torch.Tensor)
    idx, vals = cons._indices(), cons._values().clone()
    row = idx[0] * cons.shape[1] + idx[1]
    later = (row[1:] == row[:-1]).nonzero().squeeze(1) + 1
    vals[later[::17]] *= factor
    new = torch.sparse_coo_tensor(idx, vals, cons.shape, check_invariants=True).coalesce()
    return AllocationProblem(problem.revenue, problem.budget, new)


def _passes(problem: AllocationProblem, **kw: object) -> tuple[torch.Tensor, ...]:
    """Evaluate rows (metric included), primal and allocation of one SparsePass."""
    sp = SparsePass(problem, 16, 48, **kw)  # type: ignore[arg-type]  # two blocks
    k = problem.num_resources
    lam = torch.rand(k, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 0.05
    # warm enough that no entry is below the general rows' probability floor in the metric
    rows = torch.stack(sp.evaluate(lam, 5.0, 1, lambda a, s: True, HEAD, HESSIAN_SPREAD))
    inv = torch.ones(k, dtype=torch.float64)
    inv[::3] = 0.7
    return rows.sum(0), sp.primal(inv), sp.allocation(lam, 5.0, inv)


@pytest.mark.parametrize("mixed", [False, True], ids=["single", "mixed"])
def test_generated_rows_compress_exactly(mixed: bool) -> None:
    problem = generate_problem(300, 12, 16, seed=5, mixed=mixed).to_sparse()
    pats = SparsePass(problem, 64, 128).pats  # one per block of 128 users
    assert len(pats) == 3
    backs = []
    for pat in pats:
        assert pat is not None and not bool(pat.general_rows.any())
        assert len(pat.scales) == (2 if mixed else 1)  # counting inventories: their own group
        assert pat.num_patterns <= 8 * 12  # one per (segment, item) at most
        backs.append(
            sum(s.double()[:, None] * p[pat.pid] for s, p in zip(pat.scales, pat.patterns))
        )
    want = problem.dense_consumption().double().reshape(300 * 12, 16)
    back = torch.cat(backs)
    assert torch.allclose(back, want, rtol=8 * torch.finfo(torch.float32).eps, atol=0)


@pytest.mark.parametrize("case", ["generated", "partly", "general"])
def test_compressed_scipy_and_scatter_passes_agree(case: str) -> None:
    if case == "general":
        problem = _random_sparse(90, 7, 9, seed=2)
        problem = AllocationProblem(
            problem.revenue.double(), problem.budget.double(), problem.consumption.double()
        )
    else:
        mixed = case == "generated"
        problem = generate_problem(90, 7, 9, seed=2, mixed=mixed, dtype=torch.float64).to_sparse()
    if case == "partly":
        problem = _perturbed(problem, 1 + 1e-9)  # far below float32's rounding, not float64's
    sp = SparsePass(problem, 16, 48)
    if case == "general":
        assert all(pat is None for pat in sp.pats)
    else:
        assert all(pat is not None for pat in sp.pats)
        general = sum(int(pat.general_rows.sum()) for pat in sp.pats if pat is not None)
        assert general < 90 * 7 and (case != "partly" or general > 0)
    want = _passes(problem, compress=False, scipy=False)  # index scatters, the plain reference
    for kw in ({}, {"compress": False}):
        got = _passes(problem, **kw)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_an_instance_that_does_not_compress_against_highs() -> None:
    problem = _random_sparse(150, 10, 8, seed=3)
    assert all(pat is None for pat in SparsePass(problem, 64, 128).pats)
    _check_against_highs(problem)


def test_a_partly_compressing_instance_against_highs() -> None:
    problem = _perturbed(generate_problem(200, 10, 12, seed=6).to_sparse(), 1.01)
    pats = SparsePass(problem, 64, 128).pats
    general = sum(int(pat.general_rows.sum()) for pat in pats if pat is not None)
    assert all(pat is not None for pat in pats) and 0 < general < 2000
    _check_against_highs(problem)


def test_explicit_zeros_empty_rows_and_wide_value_ranges() -> None:
    # entries of value 0 consume nothing; rows with no entries; values from 1e-6 to 1e6
    gen = torch.Generator().manual_seed(4)
    n, m, k = 60, 5, 4
    idx = torch.stack(
        [
            torch.randint(0, n, (400,), generator=gen),
            torch.randint(0, m, (400,), generator=gen),
            torch.randint(0, k, (400,), generator=gen),
        ]
    )
    vals = 10.0 ** (torch.rand(400, generator=gen) * 12 - 6)
    vals[::7] = 0.0
    cons = torch.sparse_coo_tensor(idx, vals, (n, m, k), check_invariants=True).coalesce()
    problem = AllocationProblem(torch.rand(n, m, generator=gen), torch.full((k,), 3.0), cons)
    a, b = solve(problem, gap=1e-4, device="cpu"), solve(problem, gap=1e-4, device="cpu")
    assert a.converged and a.primal_value == b.primal_value
    optimum = solve_with_highs(problem, solver="simplex").objective
    assert a.primal_value <= optimum * (1 + 1e-7) <= a.dual_value * (1 + 2e-7)


@pytest.mark.parametrize("mixed", [False, True], ids=["single", "mixed"])
def test_sparse_and_factorised_forms_reach_the_same_optimum(mixed: bool) -> None:
    fact = generate_problem(2000, 30, 40, seed=8, mixed=mixed)
    a = solve(fact, gap=1e-5, device="cpu")
    b = solve(fact.to_sparse(), gap=1e-5, device="cpu")
    assert a.converged and b.converged
    # each certificate brackets the other's primal: the same optimum to within the gap
    assert a.primal_value <= b.dual_value * (1 + 1e-7)
    assert b.primal_value <= a.dual_value * (1 + 1e-7)
    assert b.primal_value == pytest.approx(a.primal_value, rel=2e-5)
    # duals: the same resources bind (a dual far from 0 in one is far from 0 in the other)
    big = a.duals > 1e-3 * float(a.duals.max())
    assert bool((b.duals[big] > 0).all())


def test_partitions_on_block_boundaries_see_the_local_rows_bit_for_bit() -> None:
    # patterns are found per reduction block, so Ray partitions (which start on block
    # boundaries) compress the same rows the same way as the local solve
    problem = generate_problem(2000, 10, 8, seed=3, sparse=True)
    lam = torch.rand(8, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 0.05
    local = Partition(problem, 16, 16)
    want = local.evaluate(lam, 0.05, stride=2)
    got = []
    for a, b in ((0, 768), (768, 1536), (1536, 2000)):
        got.append(Partition(slice_users(problem, a, b), 16, 16, offset=a).evaluate(lam, 0.05, 2))
    assert torch.equal(torch.cat(got), want)


def test_no_entries_and_too_many_patterns_for_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = torch.sparse_coo_tensor(
        torch.zeros(3, 0, dtype=torch.long), torch.zeros(0), (40, 6, 3), check_invariants=True
    )
    problem = AllocationProblem(torch.rand(40, 6) - 0.2, torch.ones(3), empty)
    result = solve(problem, gap=1e-4, device="cpu")
    # nothing consumes anything: every user takes its best item if its revenue is positive
    want = float(problem.revenue.amax(1).clamp_min(0).double().sum())
    assert result.converged and result.primal_value <= want * (1 + 1e-7)
    assert result.dual_value >= want * (1 - 1e-7)
    assert result.primal_value == pytest.approx(want, rel=1e-4)
    # patterns x K above the memory cap: no compression, the same answer
    generated = generate_problem(300, 12, 16, seed=5).to_sparse()
    assert all(p is not None for p in SparsePass(generated, 64, 128).pats)
    monkeypatch.setattr("eventbus.solver._patterns.MAX_PATTERN_ENTRIES", 16 * 10)
    assert all(p is None for p in SparsePass(generated, 64, 128).pats)


def _few_patterns(counts_only: bool = False, same_support: bool = False) -> AllocationProblem:
    """Rows ``w[i, j] * P[j % 2]`` on four resources and two counting inventories (values 1
    and 2.5 on item subsets): three patterns at most, fewer than the 12 items."""
    gen = torch.Generator().manual_seed(7)
    n, m = 90, 12
    pats = torch.rand(2, 4, generator=gen, dtype=torch.float64) + 0.1
    if not same_support:
        pats[0, 1] = 0.0  # pattern 0 leaves resource 1 out
    w = torch.rand(n, m, generator=gen, dtype=torch.float64) * 3 + 0.2
    dense = torch.zeros(n, m, 6, dtype=torch.float64)
    dense[:, :, :4] = w[:, :, None] * pats[torch.arange(m) % 2][None]
    dense[:, ::3, 4] = 1.0
    dense[:, :, 5] = 2.5
    if counts_only:
        dense = dense[:, :, 4:].contiguous()
    revenue = torch.rand(n, m, generator=gen, dtype=torch.float64) * 2 - 0.3
    budget = 0.3 * dense.sum((0, 1)) / m
    return AllocationProblem(revenue, budget, dense.to_sparse())


@pytest.mark.parametrize("counts_only", [False, True], ids=["mixed", "counts"])
def test_few_patterns_use_the_dense_metric_and_match_the_reference(counts_only: bool) -> None:
    # patterns <= items: the metric's per-user sums are dense (not a CSR product); counts
    # only: one group whose scale is 1
    problem = _few_patterns(counts_only)
    sp = SparsePass(problem, 16, 48)
    for pat in sp.pats:
        assert pat is not None and not bool(pat.general_rows.any())
        assert pat.num_patterns + 1 <= problem.revenue.shape[1]
        assert len(pat.scales) == (1 if counts_only else 2)
    want = _passes(problem, compress=False, scipy=False)
    for a, b in zip(_passes(problem), want):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_hash_collisions_only_make_rows_general(monkeypatch: pytest.MonkeyPatch) -> None:
    # every ratio hashed alike: rows on the same resources collide whatever their values; the
    # entry-by-entry check must leave the mismatched rows general (or, past half of the rows,
    # compress nothing), and the passes stay exact
    problem = _few_patterns(same_support=True)
    for pat in SparsePass(problem, 16, 48).pats:  # unhindered: every row compresses
        assert pat is not None and not bool(pat.general_rows.any())
    monkeypatch.setattr(
        "eventbus.solver._rowkeys._ratio_bits", lambda r: torch.zeros(r.shape, dtype=torch.int32)
    )
    sp = SparsePass(problem, 16, 48)
    assert any(pat is None or bool(pat.general_rows.any()) for pat in sp.pats)
    want = _passes(problem, compress=False, scipy=False)
    for a, b in zip(_passes(problem), want):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
