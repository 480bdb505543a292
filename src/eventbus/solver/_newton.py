"""Projected Newton steps for ``min f(y)`` subject to ``y >= 0`` (one ``y`` per resource).

Two-metric projection (Bertsekas 1982): coordinates at the bound whose gradient pushes outwards
are held, the Newton system is solved on the others (Cholesky, with growing damping if the
Hessian is singular), and a backtracking Armijo search runs along ``max(0, y + alpha d)``.
Float64 on the CPU, deterministic.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["NewtonSolver", "projected_gradient"]

Objective = Callable[[torch.Tensor], tuple[float, torch.Tensor, torch.Tensor]]


def projected_gradient(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The gradient with the entries blocked by the bound ``y >= 0`` zeroed."""
    return torch.where((y <= 0) & (g > 0), torch.zeros_like(g), g)


def _direction(y: torch.Tensor, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    free = ~((y <= 1e-12) & (g > 0))
    d = torch.zeros_like(g)
    if not bool(free.any()):
        return d
    hf = h[free][:, free]
    gf = g[free]
    diag = hf.diagonal().clamp_min(0)
    damp = 1e-10 * max(float(diag.max()), 1e-300)
    eye = torch.eye(hf.shape[0], dtype=hf.dtype)
    for _ in range(12):
        chol, info = torch.linalg.cholesky_ex(hf + damp * eye)
        if int(info) == 0:
            d[free] = -torch.cholesky_solve(-(-gf)[:, None], chol).squeeze(1)
            if float(d @ g) < 0:
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
        d = _direction(y, g, h)
        big = float(d.abs().max()) if d.numel() else 0.0
        if big == 0.0:
            return None
        alpha = min(1.0, self.radius / big)
        for _ in range(40):
            y_new = (y + alpha * d).clamp_min(0.0)
            f_new, g_new, h_new = fun(y_new)
            decrease = float(g @ (y_new - y))
            if f_new <= f + 1e-4 * decrease and decrease < 0:
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
