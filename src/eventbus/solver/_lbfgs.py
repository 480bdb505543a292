"""The dual solver's steps for thousands of resources: L-BFGS-B within each temperature stage.

The projected Newton steps (:mod:`eventbus.solver._newton`) need the ``K x K`` metric: at
K = 10,000 that is 800 MB per reduction block, ``G K^2 m`` flops to form and ``K^3 / 3`` to
factor, every step. Here a stage minimises the smoothed dual at its temperature with scipy's
L-BFGS-B (bounds ``y >= 0``, ``MEMORY`` correction pairs): one pass per function evaluation,
``O(K)`` memory beyond the data, and the continuation, the repair and the certificate of
:mod:`eventbus.solver._dual` unchanged. After every accepted step the last evaluation (the
accepted point, else one more pass there) is repaired into a feasible primal and the gap
certified; a stage ends as a Newton stage does (the projected gradient small next to the gap,
or the gap stalled), or when L-BFGS-B stops (its line search finds no decrease in ``f``'s
rounding), and the next stage is colder by ``TAU_FACTOR``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from eventbus.solver._newton import projected_gradient
from eventbus.solver._problem import AllocationProblem

if TYPE_CHECKING:
    from eventbus.solver._dual import _Dual

__all__ = ["lbfgs_stages", "mean_coefficients"]

MEMORY = 20  # L-BFGS correction pairs
STAGE_ITERATIONS = 150  # accepted steps per temperature stage at most
TAU_FACTOR = 0.3  # gentler than Newton's 0.1: a stage starts nearer its optimum
STALL = 4  # certificates without a 2 % better gap (and a small residual) end a stage
CERTIFY_EVERY = 3
RESIDUAL = "max"


class _Stage:
    """One temperature stage: L-BFGS-B from ``d.y`` at ``d.tau``, certifying every step."""

    def __init__(
        self,
        d: _Dual,
        gap: float,
        iterations: int,
        cap: int,
        cur_gap: float,
        report: Callable[[int, float], None],
    ) -> None:
        self.d, self.gap, self.cap, self.report = d, gap, cap, report
        self.iterations, self.cur_gap = iterations, cur_gap
        self.history = [cur_gap]
        self.g: torch.Tensor | None = None
        self.t = _variable_scale(d)
        self.steps = 0

    def fun(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        f, g = self.d.value_grad(torch.from_numpy(np.array(x, dtype=np.float64)) * self.t)
        self.g = g
        return f, (g * self.t).numpy()

    def accepted(self, intermediate_result: Any) -> None:
        d = self.d
        y = torch.from_numpy(np.array(intermediate_result.x, dtype=np.float64)) * self.t
        if d.last_y is None or not torch.equal(d.last_y, y):
            self.fun((y / self.t).numpy())  # the repair needs the pass at the accepted point
        d.y = y
        self.iterations += 1
        self.steps += 1
        assert self.g is not None
        pg = _residual(y, self.g)
        cur = self.cur_gap
        # the repair and certificate every CERTIFY_EVERY steps, and whenever the residual is
        # small enough for the stage to end (a step costs one pass, a repair most of another)
        if self.steps % CERTIFY_EVERY and pg > max(self.gap, cur):
            if self.iterations >= self.cap:
                raise StopIteration
            return
        self.cur_gap = cur = d.certify()
        self.history.append(cur)
        self.report(self.iterations, cur)
        h = self.history
        stalled = len(h) > STALL and h[-1] > 0.98 * h[-1 - STALL]
        if (
            cur <= self.gap
            or self.iterations >= self.cap
            or pg <= 0.1 * max(self.gap, cur)
            or (stalled and pg <= max(self.gap, cur))
        ):
            raise StopIteration

    def run(self) -> None:
        from scipy.optimize import Bounds, minimize

        k_num = self.d.k_num
        minimize(
            self.fun,
            (self.d.y / self.t).numpy(),
            jac=True,
            method="L-BFGS-B",
            bounds=Bounds(np.zeros(k_num), np.full(k_num, np.inf)),
            callback=self.accepted,
            options={
                "maxcor": MEMORY,
                "maxiter": STAGE_ITERATIONS,
                "ftol": 1e-15,
                "gtol": 0.01 * self.gap,
            },
        )


def _residual(y: torch.Tensor, g: torch.Tensor) -> float:
    """The dual residual that ends a stage."""
    pg = projected_gradient(y, g).abs()
    if RESIDUAL == "max":
        return float(pg.max())
    return float(((y + 1.0 / max(1, y.numel())) * pg).sum())


def _variable_scale(d: _Dual) -> torch.Tensor:
    """``t`` with ``y = t * z``: L-BFGS-B runs in ``z``, where the metric's diagonal is about
    even. In ``y`` it is about ``C * coef_k / (b_k * tau)`` (``coef_k``: resource ``k``'s mean
    coefficient, weighted by value: ``sum m^2 / sum m``), i.e. inversely proportional to the units
    a budget affords; without ``coef`` every ``t_k`` is 1."""
    coef = d.coef
    if coef is None:
        return torch.ones_like(d.b)
    curv = coef / d.b
    good = torch.isfinite(curv) & (curv > 0)
    mean = float(curv[good].mean()) if bool(good.any()) else 1.0
    curv = torch.where(good, curv, torch.full_like(curv, mean))
    return (curv / mean).rsqrt()


def lbfgs_stages(
    d: _Dual, gap: float, max_iterations: int, report: Callable[[int, float], None]
) -> tuple[int, float]:
    """Temperature stages of L-BFGS-B steps; ``(iterations, certified gap)``."""
    from eventbus.solver._dual import TAU_FLOOR

    iterations = 0
    cur_gap = math.inf
    while True:
        d.value_grad(d.y)
        cur_gap = d.certify()
        if cur_gap > gap and iterations < max_iterations:
            stage = _Stage(d, gap, iterations, max_iterations, cur_gap, report)
            stage.run()
            iterations, cur_gap = stage.iterations, stage.cur_gap
        if cur_gap <= gap or iterations >= max_iterations or d.tau <= TAU_FLOOR * d.mean_best:
            return iterations, cur_gap
        d.tau *= TAU_FACTOR


def uses_lbfgs(problem: AllocationProblem, method: str) -> bool:
    """Whether a solve of ``problem`` with ``method`` takes L-BFGS-B steps."""
    from eventbus.solver._dual import NEWTON_MAX_RESOURCES

    return method == "lbfgs" or (method == "auto" and problem.num_resources > NEWTON_MAX_RESOURCES)


def mean_coefficients(problem: AllocationProblem) -> torch.Tensor:
    """Each resource's mean coefficient weighted by value, ``sum m^2 / sum m`` over every
    (user, item) entry, float64 on the CPU (NaN for a resource nothing consumes)."""
    cons = problem.consumption
    k_num = problem.num_resources
    if isinstance(cons, torch.Tensor):
        kk, vals = cons.indices()[2], cons.values().double()
        s1 = torch.zeros(k_num, dtype=torch.float64, device=vals.device).index_add_(0, kk, vals)
        s2 = torch.zeros_like(s1).index_add_(0, kk, vals * vals)
        return (s2 / s1).cpu()
    g_num, m = cons.num_segments, problem.num_items
    s1 = torch.zeros(k_num, dtype=torch.float64)
    s2 = torch.zeros(k_num, dtype=torch.float64)
    seg = cons.segment.cpu().long()
    for name, rows in cons.groups:
        rows = rows.cpu()
        w = cons.weight_of(name)
        q1 = torch.zeros(g_num, m, dtype=torch.float64)
        q2 = torch.zeros(g_num, m, dtype=torch.float64)
        if w is None:
            q1.index_add_(0, seg, torch.ones(seg.numel(), m, dtype=torch.float64))
            q2 = q1
        else:
            w64 = w.cpu().double()
            q1.index_add_(0, seg, w64)
            q2.index_add_(0, seg, w64 * w64)
        ic, sm = cons.item_cost[rows].cpu().double(), cons.segment_mask[rows].cpu().double()
        s1[rows] = ((ic @ q1.T) * sm).sum(1)
        s2[rows] = (((ic * ic) @ q2.T) * (sm * sm)).sum(1)
    return s2 / s1
