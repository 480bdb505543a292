"""The dual solver's loop: entropy-smoothed Lagrangian dual, temperature continuation, Newton.

The solver minimises, over duals ``lam >= 0``, the smoothed dual
``D_tau(lam) = sum_i tau * log(1 + sum_j exp(r_ij / tau)) + lam . b`` (``r = c - lam . m``), which
bounds the LP dual ``D(lam) = sum_i max(0, max_j r_ij) + lam . b`` from above and tends to it as
``tau -> 0``. Duals are scaled per resource, ``lam_k = y_k * C / b_k`` with ``C = D(0)``, so the
gradient in ``y`` is the relative slack ``1 - usage_k / b_k`` and ``sum_k y_k <= 1`` at the optimum.

After every accepted step the smoothed choice ``p`` is repaired into a feasible primal (each
over-used resource's consumers are scaled back to its budget) and the relative gap
``(D(lam) - P) / D(lam)`` between the best LP dual bound and the best feasible primal value is a
certificate: the LP optimum lies between them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from eventbus.solver._kernel import HEAD
from eventbus.solver._newton import NewtonSolver, projected_gradient

__all__ = [
    "METHODS",
    "NEWTON_MAX_RESOURCES",
    "Evaluator",
    "SolveProgress",
    "SolveResult",
    "run_dual",
]

METHODS = ("auto", "newton", "lbfgs")
TAU_START = 0.02  # first temperature, relative to the mean best revenue C / n
TAU_FACTOR = 0.1  # continuation: each stage divides the temperature by 10
TAU_FLOOR = 1e-7
STAGE_ITERATIONS = 30
NEWTON_MAX_RESOURCES = 2048  # above: L-BFGS-B steps (the K x K metric costs K^3 a step)
STALL = 4  # iterations without a 2 % better gap end a temperature stage
HESSIAN_SAMPLE = (
    1 << 22
)  # entries (of users the metric sums) in the Hessian sample (subsampled Newton)


@dataclass(frozen=True)
class SolveProgress:
    """One accepted step, as passed to ``solve(..., callback=)``."""

    iteration: int
    evaluations: int
    temperature: float
    dual_value: float
    primal_value: float
    gap: float
    seconds: float


@dataclass
class SolveResult:
    """What :func:`solve` returns.

    Attributes:
        duals: ``(K,)`` float64 CPU duals ``lam >= 0`` at the last iterate (for warm starts and
            :func:`decide`).
        primal_value: value of the best feasible (repaired) primal found.
        dual_value: the least LP dual bound ``D(lam)`` found (an upper bound on the optimum).
        gap: certified relative gap ``(dual_value - primal_value) / |dual_value|``.
        converged: whether ``gap`` reached the requested target.
        iterations: accepted Newton steps.
        evaluations: passes over the data.
        temperature: the last smoothing temperature.
        seconds: wall time of the solve.
        usage: ``(K,)`` resource use of the repaired primal (``<= budget``).
        allocation: the repaired primal ``x (n, m)`` when ``keep_allocation=True``, else ``None``.
    """

    duals: torch.Tensor
    primal_value: float
    dual_value: float
    gap: float
    converged: bool
    iterations: int
    evaluations: int
    temperature: float
    seconds: float
    usage: torch.Tensor
    allocation: torch.Tensor | None = field(default=None, repr=False)


class Evaluator(Protocol):
    """The passes a solve needs; a local :class:`Partition` list or Ray partition workers."""

    def scale(self) -> torch.Tensor: ...
    def evaluate(self, lam: torch.Tensor, tau: float, stride: int = 0) -> torch.Tensor: ...
    def primal(self, inv_rho: torch.Tensor) -> torch.Tensor: ...


def _fsum_rows(rows: torch.Tensor) -> torch.Tensor:
    # order-free sums of the per-block rows (sorted first): partitioned solves whose partitions
    # start on block boundaries see bit-identical sums
    if rows.shape[0] <= 1:
        return rows.sum(0)
    return rows.sort(0).values.sum(0)


def _inv_rho(usage: torch.Tensor, budget: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    margin = 16 * torch.finfo(dtype).eps  # the allocation is materialised in the compute dtype
    rho = usage / budget.to("cpu", torch.float64)
    return torch.where(rho > 1 - margin, (1 - margin) / rho, torch.ones_like(rho))


@dataclass
class _Best:
    dual: float = math.inf
    primal: float = -math.inf
    usage: torch.Tensor | None = None
    point: tuple[torch.Tensor, float, torch.Tensor] | None = (
        None  # (lam, tau, inv_rho) of the primal
    )


class _Dual:
    """The smoothed dual in the scaled duals ``y`` at temperature ``tau``, and the best bounds
    seen: what the continuation loop of :func:`run_dual` evaluates and certifies."""

    def __init__(
        self,
        ev: Evaluator,
        budget: torch.Tensor,
        num_users: int,
        num_items: int,
        chunk_users: int,
        dtype: torch.dtype,
        lam0: torch.Tensor | None,
        tau0: float | None,
        coef: torch.Tensor | None = None,
    ) -> None:
        self.ev = ev
        self.coef = coef  # (K,) mean coefficient per resource: L-BFGS's variable scale
        self.dtype = dtype
        self.num_users = num_users
        self.b = b = budget.to("cpu", torch.float64)
        scale = _fsum_rows(ev.scale())
        self.c_total = c_total = max(float(scale[0]), 1e-300)  # C = D(0)
        self.to_lam = to_lam = c_total / b
        self.y = torch.zeros_like(b) if lam0 is None else lam0 / to_lam
        self.mean_best = mean_best = c_total / max(1, num_users)
        tau = tau0 if tau0 is not None else TAU_START * mean_best
        if lam0 is not None and tau0 is None:
            tau = TAU_START * TAU_FACTOR**2 * mean_best
        self.tau = tau
        self.best = _Best()
        self.evals = 0
        self.k_num = b.shape[0]
        chunks = -(-num_users // max(1, chunk_users))
        self.entries = chunks * chunk_users * num_items
        self.stride = max(1, round(self.entries / HESSIAN_SAMPLE))
        self.dual = math.inf
        self.usage: torch.Tensor | None = None
        self.last_y: torch.Tensor | None = None

    def _pass(self, yv: torch.Tensor, stride: int) -> tuple[float, torch.Tensor, torch.Tensor]:
        """One pass at ``yv``: the scaled dual, its gradient and the pass's summed row."""
        lam = yv * self.to_lam
        tot = _fsum_rows(self.ev.evaluate(lam, self.tau, stride))
        self.evals += 1
        self.last_y = yv
        usage = tot[HEAD : HEAD + self.k_num]
        self.dual = float(tot[1]) + float(lam @ self.b)
        self.usage = usage
        return float(tot[0]) / self.c_total + float(yv.sum()), 1.0 - usage / self.b, tot

    def value_grad(self, yv: torch.Tensor) -> tuple[float, torch.Tensor]:
        """The scaled dual at ``yv`` and its gradient, without the Newton metric (``O(K)``)."""
        f, g, _ = self._pass(yv, 0)
        return f, g

    def fun(self, yv: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
        """The scaled dual at ``yv``, its gradient and its (sampled) Hessian."""
        f, g, tot = self._pass(yv, self.stride)
        # the next sample: about HESSIAN_SAMPLE entries of users the metric sums (at low
        # temperatures most users' choices are one-hot and left out, so the sample widens)
        summed = float(tot[3]) / max(float(tot[2]), 1.0)
        self.stride = max(1, round(self.entries * summed / HESSIAN_SAMPLE))
        k_num = self.k_num
        scale = self.to_lam / self.c_total * (self.num_users / max(float(tot[2]), 1.0))
        h = tot[HEAD + k_num :].reshape(k_num, k_num) * self.to_lam[:, None] * scale[None, :]
        return f, g, h

    def certify(self) -> float:
        """Repair the last evaluation's choice into a feasible primal; the relative gap."""
        usage = self.usage
        assert isinstance(usage, torch.Tensor)
        best = self.best
        best.dual = min(best.dual, self.dual)
        inv = _inv_rho(usage, self.b, self.dtype)
        out = self.ev.primal(inv)
        if float(out[0]) > best.primal:
            best.primal, best.usage = float(out[0]), out[1:]
            best.point = (self.y * self.to_lam, self.tau, inv)
        return (best.dual - best.primal) / max(abs(best.dual), 1e-300)


def run_dual(
    ev: Evaluator,
    budget: torch.Tensor,
    num_users: int,
    num_items: int,
    chunk_users: int,
    dtype: torch.dtype,
    *,
    gap: float,
    lam0: torch.Tensor | None,
    tau0: float | None,
    max_iterations: int,
    callback: Callable[[SolveProgress], None] | None = None,
    method: str = "auto",
    coef: torch.Tensor | None = None,
) -> tuple[SolveResult, tuple[torch.Tensor, float, torch.Tensor] | None]:
    """The continuation loop over any :class:`Evaluator` (local or distributed).

    ``method``: ``"newton"`` (the projected Newton steps, a ``K x K`` metric), ``"lbfgs"``
    (L-BFGS-B steps, ``O(K)`` memory per pass: thousands of resources, see
    :mod:`eventbus.solver._lbfgs`) or ``"auto"`` (Newton up to ``NEWTON_MAX_RESOURCES``).
    ``coef``: each resource's mean coefficient (``sum m^2 / sum m``, see
    :func:`eventbus.solver._lbfgs.mean_coefficients`), L-BFGS-B's variable scale.

    Returns the result and the point ``(lam, tau, inv_rho)`` whose repaired primal is the best.
    """
    start = time.perf_counter()
    d = _Dual(ev, budget, num_users, num_items, chunk_users, dtype, lam0, tau0, coef)
    best = d.best

    def report(iterations: int, cur_gap: float) -> None:
        if callback is not None:
            elapsed = time.perf_counter() - start
            callback(
                SolveProgress(iterations, d.evals, d.tau, best.dual, best.primal, cur_gap, elapsed)
            )

    if method == "lbfgs" or (method == "auto" and d.k_num > NEWTON_MAX_RESOURCES):
        from eventbus.solver._lbfgs import lbfgs_stages

        iterations, cur_gap = lbfgs_stages(d, gap, max_iterations, report)
    else:
        iterations, cur_gap = _newton_stages(d, gap, max_iterations, report)
    usage_x = best.usage if best.usage is not None else torch.zeros_like(d.b)
    res = SolveResult(
        duals=(d.y * d.to_lam).clone(),
        primal_value=best.primal,
        dual_value=best.dual,
        gap=cur_gap,
        converged=cur_gap <= gap,
        iterations=iterations,
        evaluations=d.evals,
        temperature=d.tau,
        seconds=time.perf_counter() - start,
        usage=usage_x,
    )
    return res, best.point


def _newton_stages(
    d: _Dual, gap: float, max_iterations: int, report: Callable[[int, float], None]
) -> tuple[int, float]:
    """Temperature stages of projected Newton steps; ``(iterations, certified gap)``."""
    iterations = 0
    cur_gap = math.inf
    newton = NewtonSolver()
    f, g, h = d.fun(d.y)
    while True:
        cur_gap = d.certify()
        stage_iters = 0
        history = [cur_gap]
        while cur_gap > gap and iterations < max_iterations:
            pg = float(projected_gradient(d.y, g).abs().max())
            # go colder once the dual residual is small next to the gap this temperature allows,
            # or once the gap stops improving here
            stalled = len(history) > STALL and history[-1] > 0.98 * history[-1 - STALL]
            if stage_iters > 0 and (
                pg <= 0.1 * max(gap, cur_gap)
                or (stalled and pg <= max(gap, cur_gap))
                or stage_iters >= STAGE_ITERATIONS
            ):
                break
            stepped = newton.step(d.fun, d.y, f, g, h)
            if stepped is None:
                f, g, h = d.fun(d.y)  # restore the partitions' cache at y
                break
            d.y, f, g, h = stepped
            iterations += 1
            stage_iters += 1
            cur_gap = d.certify()
            history.append(cur_gap)
            report(iterations, cur_gap)
        if cur_gap <= gap or iterations >= max_iterations or d.tau <= TAU_FLOOR * d.mean_best:
            break
        d.tau *= TAU_FACTOR
        newton.reset()
        f, g, h = d.fun(d.y)
    return iterations, cur_gap
