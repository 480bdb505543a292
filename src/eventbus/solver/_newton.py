"""Projected Newton steps for ``min f(y)`` subject to ``y >= 0`` (one ``y`` per resource).

Two-metric projection (Bertsekas 1982): coordinates whose gradient pushes outwards and whose
own diagonal Newton step would cross the bound are sent to it, the Newton system is solved on
the others (Cholesky, with a Levenberg-Marquardt shift ``LM_SHIFT * |g| / radius`` and growing
damping if the Hessian is singular), and a backtracking search runs along
``max(0, y + alpha d)``, the step capped at ``radius`` (a box trust region) as the projection
leaves it. A step is accepted on Armijo's test or when the slope at the new point is still
negative (``f`` is convex: that proves a decrease smaller than ``f``'s rounding).
Float64 on the CPU, deterministic.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["NewtonSolver", "projected_gradient"]

LM_SHIFT = 0.03  # Levenberg-Marquardt shift, times max |projected gradient| / step cap

Objective = Callable[[torch.Tensor], tuple[float, torch.Tensor, torch.Tensor]]


def projected_gradient(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The natural residual ``y - max(0, y - g)``: the gradient, except that an entry pushed
    outwards counts only as far as it is from the bound ``y >= 0`` (0 on the bound)."""
    return y - (y - g).clamp_min(0.0)


def _direction(
    y: torch.Tensor, g: torch.Tensor, h: torch.Tensor, shift: float = 0.0
) -> torch.Tensor:
    # active set: entries whose gradient pushes outwards and whose own (diagonal) Newton step
    # would cross the bound are sent to the bound; the Newton system is solved on the rest
    hd = h.diagonal().clamp_min(1e-300)
    held = (g > 0) & ((y <= 1e-12) | (y * hd <= g))
    free = ~held
    d = torch.where(held, -y, torch.zeros_like(g))
    if not bool(free.any()):
        return d
    hf = h[free][:, free]
    gf = g[free]
    diag = hf.diagonal().clamp_min(0)
    damp = max(1e-10 * max(float(diag.max()), 1e-300), shift * LM_SHIFT)
    eye = torch.eye(hf.shape[0], dtype=hf.dtype)
    for _ in range(12):
        chol, info = torch.linalg.cholesky_ex(hf + damp * eye)
        if int(info) == 0:
            d[free] = -torch.cholesky_solve(-(-gf)[:, None], chol).squeeze(1)
            if float(d[free] @ gf) < 0:
                return d
        damp *= 100
    d[free] = -gf / diag.clamp_min(1e-12 * max(float(diag.max()), 1e-300))
    return d


class NewtonSolver:
    """Projected Newton with an adaptive step cap (a box trust region on ``y``).

    Args:
        max_step: initial and largest step entry (the scaled duals live in ``[0, 1]``).
    """

    def __init__(self, max_step: float = 0.5) -> None:
        self.max_step = max_step
        self.radius = max_step

    def reset(self) -> None:
        """Forget the step cap (the objective changed)."""
        self.radius = self.max_step

    def step(
        self, fun: Objective, y: torch.Tensor, f: float, g: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, float, torch.Tensor, torch.Tensor] | None:
        """One step from ``(y, f, g, h)``; ``None`` if no decrease was found.

        ``fun(y)`` returns ``(f, g, h)``; the last call is always the accepted point.
        """
        # Levenberg-Marquardt shift ~ |g| / radius: an entry with next to no curvature (few
        # users, or a low temperature) gets a gradient step near the radius, not a huge one
        d = _direction(y, g, h, float(projected_gradient(y, g).abs().max()) / self.radius)
        # the cap applies to the step as the projection leaves it: an entry driven below the
        # bound moves by -y only, and must not shrink everyone else's step
        big = float(((y + d).clamp_min(0.0) - y).abs().max()) if d.numel() else 0.0
        if big == 0.0:
            return None
        alpha = min(1.0, self.radius / big)
        for _ in range(40):
            y_new = (y + alpha * d).clamp_min(0.0)
            f_new, g_new, h_new = fun(y_new)
            decrease = float(g @ (y_new - y))
            # Armijo, or (f is convex) a slope still negative at the new point, which proves
            # f_new <= f + g_new . (y_new - y) < f without comparing two rounded values of f:
            # near a temperature's optimum the decreases fall below f's float32 rounding
            if decrease < 0 and (f_new <= f + 1e-4 * decrease or float(g_new @ (y_new - y)) <= 0):
                taken = alpha * big
                if alpha < 1.0 and taken < self.radius:
                    self.radius = taken  # backtracked: this is how far the model holds
                elif taken >= self.radius:
                    self.radius = min(self.max_step, 2.0 * self.radius)
                return y_new, f_new, g_new, h_new
            denom = 2.0 * (f_new - f - decrease)
            trial = -decrease / denom if denom > 0 and decrease < 0 else 0.1
            alpha *= min(0.5, max(0.1, trial))
        return None
