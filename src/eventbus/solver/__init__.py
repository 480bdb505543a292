"""Online resource allocation: a dual LP solver for coupons, budgets and inventories.

Solve once (or periodically, warm-started), then decide per request batch at the dual prices::

    from eventbus.solver import decide, generate_problem, solve

    problem = generate_problem(10_000, 100, 10, seed=0)
    result = solve(problem, gap=1e-4)            # certified relative gap
    again = solve(problem, warm_start=result)    # fewer iterations
    items = decide(result.duals, revenue_batch, consumption_batch)  # -1: no item

Consumption comes factorised (:class:`FactorisedConsumption`: per-resource item costs, segment
masks and named per-(user, item) weights; ``O(n * m)`` per pass whatever ``K``) or as a sparse
COO ``(n, m, K)`` tensor, the general form. On the CPU the sparse form's passes are CSR
products (scipy), and rows that are scalars times one of few K-vectors are compressed when the
solve starts (``_patterns``): budgets whose coefficient is a per-(user, item) weight times a
per-(segment, item) cost, and inventories with one coefficient per resource, as the factorised
form and ``to_sparse()`` make them. Such instances solve within a small factor of the
factorised time; instances whose rows share no pattern (every coefficient its own) get no
compression and run at the CSR products' speed, ``O(entries)`` per pass.

Up to 2,048 resources each step is a projected Newton step on a ``K x K`` metric; above that
(``method="auto"``; ``"newton"`` or ``"lbfgs"`` to choose) L-BFGS-B steps in variables scaled
by each resource's mean coefficient, ``O(K)`` memory: K = 10,000 budgets and inventories on
segments x item subsets, 1e7 variables, certified to 1e-3 (``benchmarks/allocation_k10k.py``).

:func:`solve_distributed` runs the same solve over Ray actors. Names load on first use, so
``import eventbus.solver`` imports neither torch nor Ray (the CLI stays quick).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventbus.solver._decide import decide
    from eventbus.solver._distributed import solve_distributed
    from eventbus.solver._dual import SolveProgress, SolveResult
    from eventbus.solver._generate import generate_problem
    from eventbus.solver._io import load_problem, save_problem
    from eventbus.solver._problem import AllocationProblem, Consumption, FactorisedConsumption
    from eventbus.solver._solve import solve

__all__ = [
    "AllocationProblem",
    "Consumption",
    "FactorisedConsumption",
    "SolveProgress",
    "SolveResult",
    "decide",
    "generate_problem",
    "load_problem",
    "save_problem",
    "solve",
    "solve_distributed",
]

_WHERE = {
    "AllocationProblem": "_problem",
    "Consumption": "_problem",
    "FactorisedConsumption": "_problem",
    "SolveProgress": "_dual",
    "SolveResult": "_dual",
    "decide": "_decide",
    "generate_problem": "_generate",
    "load_problem": "_io",
    "save_problem": "_io",
    "solve": "_solve",
    "solve_distributed": "_distributed",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f"eventbus.solver.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    msg = f"module 'eventbus.solver' has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
