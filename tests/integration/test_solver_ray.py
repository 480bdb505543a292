"""The Ray bulk-synchronous solve gives the single-process duals."""

from __future__ import annotations

import pytest
import torch

import eventbus.solver._sample as _sample
from eventbus.solver import generate_problem, solve, solve_distributed

pytestmark = [pytest.mark.integration, pytest.mark.ray]


@pytest.mark.parametrize("form", ["factorised", "mixed", "sparse"])
def test_ray_partitions_equal_local_solve(
    ray_cluster: None, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = generate_problem(2000, 10, 8, seed=3, sparse=form == "sparse", mixed=form == "mixed")
    parts = 3
    if form == "mixed":
        # two workers from the sampled warm start that 1e8-variable solves take (250-user
        # samples from 2,000 users up here): the same sample, so the same duals
        monkeypatch.setattr(_sample, "SAMPLE_ENTRIES", 2500)
        monkeypatch.setattr(_sample, "SAMPLE_MIN_USERS", 250)
        assert _sample.wants_sample(problem)
        parts = 2
    # 16-user chunks: 8 reduction blocks, so 2 or 3 partitions really split the users
    local = solve(problem, gap=1e-4, device="cpu", chunk_users=16, num_threads=1)
    dist = solve_distributed(problem, parts, gap=1e-4, chunk_users=16, num_threads=1)
    assert local.converged and dist.converged
    assert dist.iterations == local.iterations and dist.evaluations == local.evaluations
    torch.testing.assert_close(dist.duals, local.duals, rtol=1e-12, atol=1e-12)
    assert dist.primal_value == pytest.approx(local.primal_value, rel=1e-9)
    assert dist.dual_value == pytest.approx(local.dual_value, rel=1e-12)


def test_ray_warm_start(ray_cluster: None) -> None:
    problem = generate_problem(1500, 12, 6, seed=4)
    cold = solve_distributed(problem, 2, gap=1e-4, chunk_users=32, num_threads=1)
    warm = solve_distributed(problem, 2, gap=1e-4, chunk_users=32, num_threads=1, warm_start=cold)
    assert warm.converged and warm.iterations < cold.iterations
