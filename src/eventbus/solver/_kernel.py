"""One pass over a contiguous range of users: the smoothed dual, its gradient, the repaired primal.

Users are processed in chunks (bounded memory); chunk results are summed into float64 per block
of chunks, and every reduction returns one row per block. The merger adds the rows with
``math.fsum`` (exact, so order-free): a partitioned solve whose partitions start on block
boundaries sees bit-identical sums, whatever the number of partitions.

At duals ``lam`` and temperature ``tau``, with reduced costs ``r[i, j] = c[i, j] - lam . m[i, j]``
and a null option of reduced cost 0, user ``i``'s smoothed choice is
``p[i, :] = softmax([0, r[i, :]] / tau)`` and its smoothed dual term ``tau * logsumexp``; its
unsmoothed (LP) dual term is ``max(0, max_j r[i, j])``.
"""

from __future__ import annotations

import torch

from eventbus.solver._fpass import FactorisedPass
from eventbus.solver._problem import AllocationProblem, Consumption, FactorisedConsumption
from eventbus.solver._softmax import EXP_FLOOR, softmax_with_null
from eventbus.solver._sparse import SparsePass

__all__ = ["EXP_FLOOR", "Partition", "slice_users", "softmax_with_null"]

# The Hessian leaves out users whose smoothed choice is this close to one-hot (at low
# temperatures most users): their covariance is below the float32 rounding of the others'.
HESSIAN_SPREAD = 1e-6

# Rows of Partition.evaluate: [sum_i tau*lse_i, sum_i max(0, max_j r_ij), users in the Hessian
# sample, of which users the Hessian summed, usage_0 .. usage_K-1, Hessian (K*K, when asked for)].
HEAD = 4


def slice_users(problem: AllocationProblem, start: int, stop: int) -> AllocationProblem:
    """The sub-problem of users ``[start, stop)`` (same budgets: only sums over users change)."""
    cons = problem.consumption
    sub: Consumption
    if isinstance(cons, FactorisedConsumption):
        sub = cons.slice_users(start, stop)
    else:
        idx, vals = cons.indices(), cons.values()
        lo, hi = torch.searchsorted(
            idx[0].contiguous(), torch.tensor([start, stop], device=idx.device)
        ).tolist()
        sidx = idx[:, lo:hi].clone()
        sidx[0] -= start
        sub = torch.sparse_coo_tensor(
            sidx,
            vals[lo:hi],
            (stop - start, *cons.shape[1:]),
            is_coalesced=True,
            check_invariants=False,
        )
    return AllocationProblem(problem.revenue[start:stop], problem.budget, sub)


class Partition:
    """The users of one problem (or one partition of it) and the passes over them.

    Args:
        problem: the (sub-)problem; its users are this partition's users.
        chunk_users: users per chunk.
        block_chunks: chunks per reduction block.
        offset: global index of this partition's first user (a multiple of the block size), so
            that the Hessian sample (every ``stride``-th global chunk) is partition-independent.
    """

    def __init__(
        self, problem: AllocationProblem, chunk_users: int, block_chunks: int, offset: int = 0
    ) -> None:
        self.problem = problem
        self.offset = offset
        self.chunk = max(1, int(chunk_users))
        self.block = self.chunk * max(1, int(block_chunks))
        self.n, self.m = problem.revenue.shape
        self.dtype = problem.revenue.dtype
        self.device = problem.revenue.device
        cons = problem.consumption
        self.factorised = isinstance(cons, FactorisedConsumption)
        if isinstance(cons, FactorisedConsumption):
            self._f = FactorisedPass(problem, self.chunk, self.block)
            self.num_k = cons.num_resources
        else:
            self._s = SparsePass(problem, self.chunk, self.block)
            self.num_k = self._s.k_num
        self._last: tuple[torch.Tensor, float] | None = None

    # -- passes ----------------------------------------------------------------------------

    def scale(self) -> torch.Tensor:
        """Rows ``[sum_i max(0, max_j c_ij)]`` per block (the dual at ``lam = 0``)."""
        rows = []
        for b0 in range(0, self.n, self.block):
            acc = torch.zeros((), dtype=torch.float64, device=self.device)
            for a in range(b0, min(b0 + self.block, self.n), self.chunk):
                c = self.problem.revenue[a : min(a + self.chunk, self.n)]
                acc += c.amax(1).clamp_min(0).double().sum()
            rows.append(acc.reshape(1))
        return torch.stack(rows).cpu() if rows else torch.zeros(0, 1, dtype=torch.float64)

    def evaluate(self, lam: torch.Tensor, tau: float, stride: int = 0) -> torch.Tensor:
        """Rows ``[sum tau*lse, sum max(0, max r), sampled users, users summed, usage (K), hessian (K*K)?]``.

        One row per block, float64 on the CPU. The Hessian of the smoothed dual in ``lam`` is
        ``sum_i Cov_{p_i}(m_i) / tau`` (the null option consumes nothing); with ``stride > 0`` it
        is summed over every ``stride``-th chunk only (a subsampled Newton metric), else omitted.
        It leaves out users whose likeliest option has probability above
        ``1 - HESSIAN_SPREAD`` (their covariance is below float32 rounding; at low temperatures
        that is most users, and the metric costs a fraction of a full one).
        """
        hessian = stride > 0
        lam = lam.to(self.device, torch.float64)
        k_num = self.num_k
        self._last = (lam, tau)
        if self.factorised:
            rows = self._f.evaluate(lam, tau, stride, self._sampled, HEAD, HESSIAN_SPREAD)
        else:
            rows = self._s.evaluate(lam, tau, stride, self._sampled, HEAD, HESSIAN_SPREAD)
        if not rows:
            return torch.zeros(
                0, HEAD + k_num + (k_num * k_num if hessian else 0), dtype=torch.float64
            )
        return torch.stack(rows).cpu()

    def primal(self, inv_rho: torch.Tensor) -> torch.Tensor:
        """``[value, usage (K)]`` of the repaired primal at the last evaluated point, float64.

        The repaired primal is ``x[i, j] = sigma[i, j] * p[i, j]`` where ``sigma[i, j]`` is the
        least ``inv_rho[k]`` over the resources entry ``(i, j)`` consumes: every over-used
        resource is scaled back to its budget, and nothing else grows.
        """
        inv = inv_rho.to(self.device, torch.float64)
        if self.factorised:
            return self._f.primal(inv).cpu()
        return self._s.primal(inv).cpu()

    def allocation(self, inv_rho: torch.Tensor) -> torch.Tensor:
        """The repaired primal ``x (n, m)`` at the last evaluated point, in the compute dtype."""
        inv = inv_rho.to(self.device, torch.float64)
        assert self._last is not None
        if self.factorised:
            return self._f.allocation(self._last[0], self._last[1], inv)
        return self._s.allocation(self._last[0], self._last[1], inv)

    # -- chunk kernels ---------------------------------------------------------------------

    def _sampled(self, a: int, stride: int) -> bool:
        return ((self.offset + a) // self.chunk) % stride == 0
