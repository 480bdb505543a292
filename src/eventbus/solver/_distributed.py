"""The dual solve partitioned over Ray actors, in bulk-synchronous rounds.

Partition workers hold contiguous user ranges (starting on reduction-block boundaries); a merger
actor runs the same continuation loop as :func:`eventbus.solver.solve` and, every round, sends the
duals (a K-vector) and the temperature to all workers and sums their per-block rows. Only
K-sized vectors (and the K x K Newton metric) travel; the sums are order-free, so the duals equal
a single-process solve's. Ray is imported here only, and the caller initialises it.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from eventbus.errors import SolverError, StackError
from eventbus.solver._dual import SolveResult, run_dual
from eventbus.solver._kernel import Partition, slice_users
from eventbus.solver._lbfgs import mean_coefficients, uses_lbfgs
from eventbus.solver._problem import AllocationProblem
from eventbus.solver._sample import wants_sample
from eventbus.solver._solve import (
    BLOCK_CHUNKS,
    check_options,
    chunk_users_for,
    configure_torch,
    sampled_start,
)

__all__ = ["solve_distributed"]


class _PartitionWorker:
    def __init__(
        self, problem: AllocationProblem, chunk: int, offset: int, num_threads: int
    ) -> None:
        configure_torch(num_threads)
        self.part = Partition(problem, chunk, BLOCK_CHUNKS, offset)

    def scale(self) -> torch.Tensor:
        return self.part.scale()

    def evaluate(self, lam: torch.Tensor, tau: float, stride: int = 0) -> torch.Tensor:
        return self.part.evaluate(lam, tau, stride)

    def primal(self, inv_rho: torch.Tensor) -> torch.Tensor:
        return self.part.primal(inv_rho)


class _RayEvaluator:
    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers

    def _gather(self, refs: list[Any]) -> list[torch.Tensor]:
        import ray

        return list(ray.get(refs))

    def scale(self) -> torch.Tensor:
        return torch.cat(self._gather([w.scale.remote() for w in self.workers]))

    def evaluate(self, lam: torch.Tensor, tau: float, stride: int = 0) -> torch.Tensor:
        return torch.cat(self._gather([w.evaluate.remote(lam, tau, stride) for w in self.workers]))

    def primal(self, inv_rho: torch.Tensor) -> torch.Tensor:
        parts = self._gather([w.primal.remote(inv_rho) for w in self.workers])
        return torch.stack(parts).sum(0)


class _Merger:
    def __init__(self, workers: list[Any], num_threads: int) -> None:
        configure_torch(num_threads)
        self.ev = _RayEvaluator(workers)

    def run(
        self,
        budget: torch.Tensor,
        shape: tuple[int, int, int],
        dtype: torch.dtype,
        options: dict[str, Any],
    ) -> SolveResult:
        n, m, chunk = shape
        result, _ = run_dual(self.ev, budget, n, m, chunk, dtype, **options)
        return result


def solve_distributed(
    problem: AllocationProblem,
    num_partitions: int,
    *,
    gap: float = 1e-4,
    warm_start: SolveResult | torch.Tensor | None = None,
    max_iterations: int = 1000,
    chunk_users: int | None = None,
    num_threads: int | None = None,
    num_cpus_per_actor: float = 0.0,
    sample_start: bool = True,
) -> SolveResult:
    """:func:`~eventbus.solver.solve` over ``num_partitions`` Ray actors (CPU), same duals.

    Ray must already be initialised (``ray.init(...)``) by the caller. Workers and the merger
    are created for this solve and killed after it. ``allocation`` is not gathered (``None``).

    Args:
        problem: the problem (its users are split into contiguous partitions).
        num_partitions: partition workers (at most the number of reduction blocks).
        gap: target relative primal-dual gap.
        warm_start: a previous :class:`SolveResult` or ``(K,)`` duals.
        max_iterations: cap on accepted Newton steps.
        chunk_users: users per chunk; partitions start on multiples of 16 chunks.
        num_threads: torch threads in each actor (default: this process's CPUs divided among the
            partitions; a single-process solve with the same thread count gives bit-identical duals).
        num_cpus_per_actor: Ray CPU reservation of each actor (0: do not reserve).
        sample_start: as :func:`~eventbus.solver.solve`'s (the sample is solved here, in the
            caller's process, with ``num_threads`` threads: the same start as a local solve's).

    Returns:
        The :class:`SolveResult`, as a single-process solve with the same options returns it.

    Raises:
        SolverError: an invalid option.
        StackError: Ray is not initialised.

    Example:
        >>> import ray  # doctest: +SKIP
        >>> ray.init(num_cpus=2)  # doctest: +SKIP
        >>> solve_distributed(generate_problem(10_000, 50, 10), 2).converged  # doctest: +SKIP
        True
    """
    lam0 = check_options(problem, gap, warm_start)
    if not isinstance(num_partitions, int) or num_partitions < 1:
        msg = f"num_partitions must be a positive integer; got {num_partitions!r}"
        raise SolverError(msg)
    import ray

    if not ray.is_initialized():
        msg = "solve_distributed needs a running Ray: call ray.init(...) (or ray.init(address=...)) first"
        raise StackError(msg)
    problem = problem.to("cpu")
    n = problem.num_users
    chunk = chunk_users or chunk_users_for(problem.num_items)
    block = chunk * BLOCK_CHUNKS
    blocks = max(1, -(-n // block))
    per = -(-blocks // min(num_partitions, blocks))
    bounds = [(a, min(a + per * block, n)) for a in range(0, max(n, 1), per * block)]
    # the partitions share this machine's CPUs unless told otherwise: oversubscribed OpenMP
    # threads spin against each other
    threads = num_threads or max(1, len(os.sched_getaffinity(0)) // len(bounds))
    presolve = None
    if lam0 is None and sample_start and wants_sample(problem):
        presolve = warm_start = sampled_start(problem, gap, "cpu", threads)
        lam0 = presolve.duals
    worker_cls = ray.remote(num_cpus=num_cpus_per_actor)(_PartitionWorker)
    merger_cls = ray.remote(num_cpus=num_cpus_per_actor)(_Merger)
    # actor handles: ray types their methods' `.remote` only under `@ray.method`
    workers: list[Any] = [
        worker_cls.remote(ray.put(slice_users(problem, a, b)), chunk, a, threads) for a, b in bounds
    ]
    merger: Any = merger_cls.remote(workers, threads)
    tau0 = warm_start.temperature if isinstance(warm_start, SolveResult) else None
    options = {"gap": gap, "lam0": lam0, "tau0": tau0, "max_iterations": max_iterations}
    if uses_lbfgs(problem, "auto"):  # thousands of resources: L-BFGS-B's variable scale
        options["coef"] = mean_coefficients(problem)
    try:
        shape = (n, problem.num_items, chunk)
        result: SolveResult = ray.get(
            merger.run.remote(problem.budget, shape, problem.revenue.dtype, options)
        )
    finally:
        for actor in [merger, *workers]:
            ray.kill(actor)
    if presolve is not None:
        result.seconds += presolve.seconds
    return result
