"""The same LP handed to HiGHS: the reference optimum for tests and benchmarks (not public API)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from eventbus.solver._problem import AllocationProblem

__all__ = ["HighsSolution", "solve_with_highs"]


@dataclass(frozen=True)
class HighsSolution:
    """HiGHS's answer: objective, status, wall time (build and solve separately)."""

    objective: float
    status: str
    build_seconds: float
    solve_seconds: float


def solve_with_highs(
    problem: AllocationProblem,
    *,
    solver: str = "ipm",
    gap: float | None = None,
    threads: int | None = None,
    time_limit: float | None = None,
) -> HighsSolution:
    """Build the LP (variables ``x[i, j]``, rows: users then resources) and solve it with HiGHS.

    Args:
        problem: the problem.
        solver: HiGHS ``solver`` option (``ipm``, ``simplex``, ``pdlp``); IPM runs without crossover.
        gap: IPM relative optimality tolerance (``ipm_optimality_tolerance``); HiGHS's default if None.
        threads: HiGHS threads (default: HiGHS's choice).
        time_limit: seconds HiGHS may run (its ``time_limit``; the status then says
            ``Time limit reached``).
    """
    try:
        import highspy
    except ImportError as e:  # pragma: no cover - the test extra installs it
        msg = 'the HiGHS reference needs highspy: pip install "eventbus[test]"'
        raise ImportError(msg) from e
    t0 = time.perf_counter()
    n, m = problem.num_users, problem.num_items
    k_num = problem.num_resources
    sparse = problem.to_sparse().consumption
    assert isinstance(sparse, torch.Tensor)
    idx = sparse.indices().cpu().numpy()
    vals = sparse.values().cpu().double().numpy()
    nv = n * m
    # columns: user row (coefficient 1) plus the resource rows of each variable
    col = np.concatenate([np.arange(nv, dtype=np.int64), idx[0] * m + idx[1]])
    row = np.concatenate([np.repeat(np.arange(n, dtype=np.int64), m), n + idx[2]])
    val = np.concatenate([np.ones(nv), vals])
    order = np.lexsort((row, col))
    col, row, val = col[order], row[order], val[order]
    start = np.zeros(nv + 1, dtype=np.int64)
    np.cumsum(np.bincount(col, minlength=nv), out=start[1:])
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = nv, n + k_num
    lp.col_cost_ = -problem.revenue.detach().cpu().double().numpy().reshape(-1)
    lp.col_lower_ = np.zeros(nv)
    lp.col_upper_ = np.ones(nv)
    lp.row_lower_ = np.full(n + k_num, -highspy.kHighsInf)
    lp.row_upper_ = np.concatenate([np.ones(n), problem.budget.detach().cpu().double().numpy()])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start
    lp.a_matrix_.index_ = row.astype(np.int32)
    lp.a_matrix_.value_ = val
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("solver", solver)
    h.setOptionValue("run_crossover", "off")
    h.setOptionValue("presolve", "on")
    if gap is not None:
        h.setOptionValue("ipm_optimality_tolerance", gap)
    if threads is not None:
        h.setOptionValue("threads", threads)
    if time_limit is not None:
        h.setOptionValue("time_limit", float(time_limit))
    h.passModel(lp)
    t1 = time.perf_counter()
    h.run()
    t2 = time.perf_counter()
    status: Any = h.getModelStatus()
    objective = -float(h.getInfo().objective_function_value)
    return HighsSolution(objective, h.modelStatusToString(status), t1 - t0, t2 - t1)
