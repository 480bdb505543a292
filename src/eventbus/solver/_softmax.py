"""The smoothed choice of a chunk of users: a softmax over their options and a null option."""

from __future__ import annotations

import torch

__all__ = ["EXP_FLOOR", "softmax_with_null"]

# Exponents are clamped here: exp(-80) ~ 1.8e-35 is a normal float32 (and far below either
# dtype's epsilon next to the leading term exp(0) = 1), while exponents below float32's
# underflow threshold (~ -87.3) send the vectorised exp to a path about 10x slower. At low
# temperatures most exponents are far below it.
EXP_FLOOR = -80.0


def softmax_with_null(
    r: torch.Tensor, tau: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``softmax([0, r] / tau)`` without the null column, ``tau * logsumexp``, ``max(0, max r)``
    and the softmax's denominator ``total`` (``>= 1``; the likeliest option has probability
    ``1 / total``).

    ``r`` is overwritten with the probabilities. Exponents are clamped at ``EXP_FLOOR`` (a
    term of ``exp(-80)`` instead of a smaller one: immaterial next to the leading ``exp(0)``).
    """
    best = (
        r.amax(1).clamp_min_(0)
        if r.shape[1]
        else torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    )
    r.sub_(best[:, None]).mul_(1.0 / tau).clamp_min_(EXP_FLOOR).exp_()
    total = r.sum(1).add_(torch.exp((best * (-1.0 / tau)).clamp_min_(EXP_FLOOR)))
    r.div_(total[:, None])
    lse = total.log().mul_(tau).add_(best)
    return r, lse, best, total
