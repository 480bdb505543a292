"""Building the sparse form's pass fast: pattern ids from a sampled key table
(``_rowkeys.key_ids``) and user classes (``_classes``), each against the plain path it replaces."""

from __future__ import annotations

import pytest
import torch

from eventbus.solver import AllocationProblem, generate_problem, solve
from eventbus.solver._kernel import HEAD, HESSIAN_SPREAD, Partition, slice_users
from eventbus.solver._rowkeys import key_ids
from eventbus.solver._sparse import SparsePass


def _same_partition(pid: torch.Tensor, counts: torch.Tensor, key: torch.Tensor) -> None:
    """``pid`` numbers the distinct keys densely: equal keys, equal ids, and nothing else."""
    uniq = torch.unique(key)
    assert int(counts.numel()) == int(uniq.numel()) == int(pid.max()) + 1
    pairs = torch.unique(pid.long() * (1 << 32) + (key.long() & 0xFFFFFFFF))
    assert int(pairs.numel()) == int(uniq.numel())
    assert torch.equal(counts, torch.bincount(pid, minlength=int(uniq.numel())))


def test_key_table_gives_the_unique_ids_with_misses_and_slot_collisions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gen = torch.Generator().manual_seed(3)
    # 300 common keys (most rows), 2,000 rare ones the sample mostly misses
    common = torch.randint(-(1 << 31), 1 << 31, (300,), generator=gen, dtype=torch.int64)
    rare = torch.randint(-(1 << 31), 1 << 31, (2000,), generator=gen, dtype=torch.int64)
    key = common[torch.randint(0, 300, (200_000,), generator=gen)]
    at = torch.randperm(200_000, generator=gen)[:6000]
    key[at] = rare[torch.randint(0, 2000, (6000,), generator=gen)]
    key = key.to(torch.int32)
    ids = key_ids(key)
    assert ids is not None
    _same_partition(*ids, key)
    # every key in one slot: all but one sample key lose it, their rows go to the misses
    monkeypatch.setattr(
        "eventbus.solver._rowkeys._slots", lambda k, bits: torch.zeros_like(k, dtype=torch.long)
    )
    ids = key_ids(key)
    assert ids is not None
    _same_partition(*ids, key)


def test_key_table_skips_a_block_whose_sampled_keys_are_nearly_all_distinct() -> None:
    key = torch.randperm(300_000, generator=torch.Generator().manual_seed(1)).to(torch.int32)
    assert key_ids(key) is None  # no pattern shared: the search stops at the sample
    small = key[:1000]  # below the sampling size: the plain unique, never skipped
    ids = key_ids(small)
    assert ids is not None and int(ids[1].numel()) == 1000


def _passes(problem: AllocationProblem) -> list[torch.Tensor]:
    sp = SparsePass(problem, 16, 48)
    k = problem.num_resources
    lam = torch.rand(k, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 0.05
    rows = torch.stack(sp.evaluate(lam, 5.0, 1, lambda a, s: True, HEAD, HESSIAN_SPREAD))
    inv = torch.ones(k, dtype=torch.float64)
    inv[::3] = 0.7
    return [rows.sum(0), sp.primal(inv), sp.allocation(lam, 5.0, inv)]


@pytest.mark.parametrize("mixed", [False, True], ids=["single", "mixed"])
def test_user_classes_and_the_sampled_table_match_the_per_row_path(
    mixed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = generate_problem(120, 9, 11, seed=4, mixed=mixed, dtype=torch.float64).to_sparse()
    plain = SparsePass(problem, 16, 48, compress=False)
    assert all(pat is None for pat in plain.pats)
    want = _passes(problem)  # classes found: one per segment pattern
    sp = SparsePass(problem, 16, 48)
    assert all(pat is not None and pat.classes is not None for pat in sp.pats)
    monkeypatch.setattr("eventbus.solver._rowkeys.SAMPLE_ROWS", 64)  # 432 rows a block: sampled
    sampled = SparsePass(problem, 16, 48)
    for a, b in zip(sampled.pats, sp.pats):
        assert a is not None and b is not None and a.num_patterns == b.num_patterns
    for got in (_passes(problem),):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
    monkeypatch.setattr("eventbus.solver._classes.MAX_CLASSES", 0)  # the per-row gathers
    per_row = SparsePass(problem, 16, 48)
    assert all(pat is not None and pat.classes is None for pat in per_row.pats)
    for a, b in zip(_passes(problem), want):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_a_class_hash_collision_keeps_the_per_row_path(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = generate_problem(120, 9, 11, seed=4, dtype=torch.float64).to_sparse()
    want = _passes(problem)
    # every user's row hashed alike: one class, whose check fails for the others
    monkeypatch.setattr("eventbus.solver._classes._M1", 0)
    sp = SparsePass(problem, 16, 48)
    assert all(pat is not None and pat.classes is None for pat in sp.pats)
    for a, b in zip(_passes(problem), want):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_sampled_blocks_give_partitions_the_local_rows_and_the_same_optimum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("eventbus.solver._rowkeys.SAMPLE_ROWS", 128)
    fact = generate_problem(2000, 10, 8, seed=3, mixed=True)
    problem = fact.to_sparse()
    lam = torch.rand(8, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 0.05
    local = Partition(problem, 16, 16)
    assert all(p is not None and p.classes is not None for p in local._s.pats)
    want = local.evaluate(lam, 0.05, stride=2)
    got = []
    for a, b in ((0, 768), (768, 1536), (1536, 2000)):
        got.append(Partition(slice_users(problem, a, b), 16, 16, offset=a).evaluate(lam, 0.05, 2))
    assert torch.equal(torch.cat(got), want)
    f, s = solve(fact, gap=1e-5, device="cpu"), solve(problem, gap=1e-5, device="cpu")
    assert f.converged and s.converged
    assert s.primal_value <= f.dual_value * (1 + 1e-7) and f.primal_value <= s.dual_value * (
        1 + 1e-7
    )


def test_patterns_split_by_the_hash_rounding_merge_into_one_class_per_segment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # K = 60: rows of one (segment, item) pattern whose ratios straddle a dropped hash bit get
    # two ids; merged, every segment's users are one class again (the per-row path without)
    problem = generate_problem(1000, 40, 60, seed=1).to_sparse()
    sp = SparsePass(problem, 500, 1000)
    pat = sp.pats[0]
    assert pat is not None and pat.classes is not None and pat.classes.num == 8
    assert not bool(pat.general_rows.any())
    want = problem.dense_consumption().double().reshape(1000 * 40, 60)
    back = sum(s.double()[:, None] * p[pat.pid] for s, p in zip(pat.scales, pat.patterns))
    assert torch.allclose(back, want, rtol=8 * torch.finfo(torch.float32).eps, atol=0)
    monkeypatch.setattr("eventbus.solver._patterns.merge_split", lambda p, t: None)
    split = SparsePass(problem, 500, 1000).pats[0]
    assert split is not None and split.classes is None
    assert split.num_patterns > pat.num_patterns


def test_merge_split_joins_only_patterns_within_the_tolerance() -> None:
    from eventbus.solver._classes import merge_split

    tol = 4 * torch.finfo(torch.float32).eps
    # a value on a coarse cell boundary (float32 bits a multiple of 2 ** 13): its twin one ulp
    # below is in the cell before in the first round, the same cell in the second
    edge = torch.tensor([(1 << 13) * 130_000], dtype=torch.int32).view(torch.float32).double()
    below = torch.nextafter(edge.float(), torch.tensor(0.0)).double()
    a = torch.tensor([[0.25, 0.0, 0.5]], dtype=torch.float64)
    pats = torch.cat(
        [
            torch.cat([a, edge[:, None]], 1),  # 0
            torch.cat([a * (1 + 1e-7), below[:, None]], 1),  # 1: 0's twin across the edge
            torch.cat([a * (1 + 1e-3), edge[:, None]], 1),  # 2: same cells, not within tol
            torch.cat([a.clamp_min(0.1), edge[:, None]], 1),  # 3: another support
            torch.cat([a * (1 - 1e-7), edge[:, None]], 1),  # 4: 0's twin, same cells
        ]
    )
    remap = merge_split(pats, tol)
    assert remap is not None
    assert remap.tolist() == [0, 0, 1, 2, 0]
    assert merge_split(pats[[0, 2, 3]], tol) is None  # nothing within the tolerance


def test_a_block_of_rows_of_their_own_stops_before_the_pattern_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # every coefficient its own (rows with one entry are the only shared patterns): the search
    # must give up on the counts alone, before building, merging or checking patterns
    gen = torch.Generator().manual_seed(5)
    n, m, k = 400, 30, 10
    dense = torch.rand(n, m, k, generator=gen) * (torch.rand(n, m, k, generator=gen) < 0.3)
    problem = AllocationProblem(torch.rand(n, m, generator=gen), torch.ones(k), dense.to_sparse())

    def boom(*args: object) -> None:
        raise AssertionError("the pattern table was built")

    monkeypatch.setattr("eventbus.solver._patterns.merge_split", boom)
    for sample in (1 << 16, 256):  # the plain unique and the sampled key table
        monkeypatch.setattr("eventbus.solver._rowkeys.SAMPLE_ROWS", sample)
        assert all(pat is None for pat in SparsePass(problem, 64, 128).pats)
