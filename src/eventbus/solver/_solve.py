"""The dual solver, local: entropy-smoothed Lagrangian dual over local partitions.

The loop itself (temperature continuation, Newton steps, the primal repair and its gap
certificate) is :mod:`eventbus.solver._dual`; this module checks the options, places the problem
on its device in chunks and runs the loop over local partitions.

Without a warm start, a large factorised problem first solves a random sample of its users
(:mod:`eventbus.solver._sample`) and starts from those duals: 1e8 variables take 4-6 passes
over the data instead of about 20.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from eventbus.errors import SolverError
from eventbus.solver._dual import METHODS, TAU_FACTOR, SolveProgress, SolveResult, run_dual
from eventbus.solver._kernel import Partition
from eventbus.solver._lbfgs import mean_coefficients, uses_lbfgs
from eventbus.solver._problem import AllocationProblem
from eventbus.solver._sample import sample_size, sample_users, wants_sample

__all__ = ["solve"]

TARGET_CHUNK_ELEMENTS = 1 << 17
# On a GPU a chunk is a few kernel launches whatever its size: small chunks leave it waiting on
# the launches (H100, 1e8 entries: a pass 463 ms at 2^17 entries a chunk, 6.3 ms at 2^24)
TARGET_CUDA_CHUNK_ELEMENTS = 1 << 24
BLOCK_CHUNKS = 16
SAMPLE_WARMER = (
    TAU_FACTOR**0.5
)  # the sampled start: the sample's last temperature, half a stage warmer
SMALL_PROBLEM = 1 << 20  # entries below which the default is one torch thread


def configure_torch(num_threads: int | None = None) -> int:
    """Flush denormals and pin torch's threads to the CPUs this process may run on."""
    torch.set_flush_denormal(True)
    n = num_threads or len(os.sched_getaffinity(0))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def chunk_users_for(num_items: int, device: torch.device | None = None) -> int:
    """Users per chunk so that one chunk holds about ``TARGET_CHUNK_ELEMENTS`` entries
    (``TARGET_CUDA_CHUNK_ELEMENTS`` on a GPU)."""
    target = TARGET_CHUNK_ELEMENTS
    if device is not None and device.type == "cuda":
        target = TARGET_CUDA_CHUNK_ELEMENTS
    return max(1, target // max(1, num_items))


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``auto``/``None``: CUDA when present, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        msg = f"device must be 'auto', 'cpu' or 'cuda[:N]'; got {device!r}"
        raise SolverError(msg) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        msg = (
            f"device {device!r} was asked for but CUDA is not available; use device='cpu' or 'auto'"
        )
        raise SolverError(msg)
    return dev


def check_options(
    problem: AllocationProblem, gap: float, warm_start: object, method: str = "auto"
) -> torch.Tensor | None:
    """Validate solver options; return the warm-start duals (float64, CPU) if any."""
    if not isinstance(problem, AllocationProblem):
        msg = f"problem must be an AllocationProblem; got {type(problem).__name__}"
        raise SolverError(msg)
    if method not in METHODS:
        msg = f"method must be one of {', '.join(map(repr, METHODS))}; got {method!r}"
        raise SolverError(msg)
    if not (0 < gap < 1):
        msg = f"gap must lie in (0, 1) (a relative gap such as 1e-4); got {gap!r}"
        raise SolverError(msg)
    if warm_start is None:
        return None
    lam = warm_start.duals if isinstance(warm_start, SolveResult) else warm_start
    if not isinstance(lam, torch.Tensor) or lam.shape != (problem.num_resources,):
        got = tuple(lam.shape) if isinstance(lam, torch.Tensor) else type(lam).__name__
        msg = f"warm_start must be a SolveResult or a ({problem.num_resources},) dual tensor; got {got}"
        raise SolverError(msg)
    lam = lam.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(lam).all()) or float(lam.min()) < 0:
        msg = "warm_start duals must be finite and non-negative; clip them with .clamp_min(0)"
        raise SolverError(msg)
    return lam


def solve(
    problem: AllocationProblem,
    *,
    gap: float = 1e-4,
    warm_start: SolveResult | torch.Tensor | None = None,
    device: str | torch.device | None = "auto",
    max_iterations: int = 1000,
    keep_allocation: bool = False,
    chunk_users: int | None = None,
    num_threads: int | None = None,
    callback: Callable[[SolveProgress], None] | None = None,
    sample_start: bool = True,
    method: str = "auto",
) -> SolveResult:
    """Solve the allocation LP to a certified relative gap.

    Args:
        problem: the problem (see :class:`AllocationProblem`).
        gap: target relative primal-dual gap.
        warm_start: a previous :class:`SolveResult` (its duals and temperature) or a ``(K,)`` dual
            tensor; a good warm start needs fewer iterations.
        device: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda[:N]"``.
        max_iterations: cap on accepted Newton steps.
        keep_allocation: also return the repaired primal ``x (n, m)``.
        chunk_users: users per chunk (memory bound); default about 131k entries per chunk on
            the CPU, 16.8M on a GPU.
        num_threads: torch threads (default: the CPUs this process may use; 1 below ~1M entries).
        callback: called after every accepted step with a :class:`SolveProgress`.
        sample_start: without ``warm_start``, start a large factorised problem (at least 8 times
            the sample's ~1M entries) from the duals of a random sample of its users (see
            :func:`sample_start`); ``seconds`` includes that solve, ``evaluations`` counts passes
            over the whole data only.
        method: ``"auto"`` (projected Newton up to 2,048 resources, L-BFGS-B above),
            ``"newton"`` (a ``K x K`` metric per step: hundreds of resources) or ``"lbfgs"``
            (``O(K)`` memory a step: thousands of resources).

    Returns:
        A :class:`SolveResult`; ``converged`` says whether ``gap`` was reached.

    Raises:
        SolverError: an invalid option or warm start.

    Example:
        >>> from eventbus.solver import generate_problem, solve
        >>> result = solve(generate_problem(200, 20, 5, seed=1), gap=1e-3, device="cpu")
        >>> result.converged and result.gap <= 1e-3
        True
    """
    lam0 = check_options(problem, gap, warm_start, method)
    dev = resolve_device(device)
    # below ~1M entries a chunk's ops are too small to split, and split OpenMP regions stall
    # badly when other processes share the cores: one thread
    small = problem.num_users * problem.num_items < SMALL_PROBLEM
    presolve = None
    if lam0 is None and sample_start and wants_sample(problem):
        presolve = warm_start = sampled_start(problem, gap, dev, num_threads, method)
        lam0 = presolve.duals
    configure_torch(num_threads or (1 if small else None))
    try:
        if problem.revenue.device != dev:
            problem = problem.to(dev)
        chunk = chunk_users or chunk_users_for(problem.num_items, dev)
        part = Partition(problem, chunk, BLOCK_CHUNKS)
        tau0 = warm_start.temperature if isinstance(warm_start, SolveResult) else None
        result, best = run_dual(
            part,
            problem.budget,
            problem.num_users,
            problem.num_items,
            chunk,
            problem.revenue.dtype,
            gap=gap,
            lam0=lam0,
            tau0=tau0,
            max_iterations=max_iterations,
            callback=callback,
            method=method,
            coef=mean_coefficients(problem) if uses_lbfgs(problem, method) else None,
        )
        if presolve is not None:
            result.seconds += presolve.seconds
        if keep_allocation and best is not None:
            part.evaluate(best[0], best[1])
            result.allocation = part.allocation(best[2])
        return result
    finally:
        # Denormals flushed is process-wide floating-point state: give the caller (a replica,
        # a test process) its IEEE behaviour back.
        torch.set_flush_denormal(False)


def sampled_start(
    problem: AllocationProblem,
    gap: float,
    device: torch.device | str,
    num_threads: int | None,
    method: str = "auto",
) -> SolveResult:
    """The solve of a random sample of ``problem``'s users (budgets scaled to the sample's
    share), whose duals and last temperature warm-start the full solve. The sample is drawn with
    a fixed seed: a local and a distributed solve start from the same point."""
    start = time.perf_counter()
    sub = sample_users(problem, sample_size(problem))
    result = solve(
        sub,
        gap=max(gap, 1e-3),
        device=device,
        num_threads=num_threads,
        sample_start=False,
        method=method,
    )
    result.seconds = time.perf_counter() - start
    # the full solve starts half a temperature stage warmer than the sample ended: the sample's
    # duals are off by its sampling noise, and a cold start from off duals can stall (a
    # 2,000-user sample of a mixed 1e6 problem: 284 passes and no convergence at its own
    # temperature, 51 passes half a stage warmer; 4-6 passes at 1e7 and 1e8 with the default size)
    result.temperature /= SAMPLE_WARMER
    return result
