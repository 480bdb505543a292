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

__all__ = ["EXP_FLOOR", "Partition", "slice_users", "softmax_with_null"]

# The Hessian leaves out users whose smoothed choice is this close to one-hot (at low
# temperatures most users): their covariance is below the float32 rounding of the others'.
HESSIAN_SPREAD = 1e-6
# The sparse Hessian also leaves out entries of probability below this.
SPARSE_P_FLOOR = 1e-7

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
        idx, vals = cons._indices(), cons._values()
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
            idx = cons._indices()
            self.ptr = torch.searchsorted(
                idx[0].contiguous(), torch.arange(self.n + 1, device=self.device)
            ).tolist()
            self.flat = idx[0] * self.m + idx[1]
            self.kk = idx[2].contiguous()
            self.vals = cons._values().to(self.dtype)
            self.num_k = int(cons.shape[2])
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
        rows = []
        if self.factorised:
            rows = self._f.evaluate(lam, tau, stride, self._sampled, HEAD, HESSIAN_SPREAD)
        else:
            lam_c = lam.to(self.dtype)
            width = HEAD + k_num + (k_num * k_num if hessian else 0)
            for b0 in range(0, self.n, self.block):
                row = torch.zeros(width, dtype=torch.float64, device=self.device)
                for a in range(b0, min(b0 + self.block, self.n), self.chunk):
                    b = min(a + self.chunk, self.n)
                    p, lse, best, flat, e0, e1, total = self._soft_sparse(a, b, lam_c, tau)
                    row[0] += lse.double().sum()
                    row[1] += best.double().sum()
                    pv = self.vals[e0:e1] * p.view(-1)[flat]
                    row[HEAD : HEAD + k_num].index_add_(0, self.kk[e0:e1], pv.double())
                    if hessian and self._sampled(a, stride):
                        kept, h = self._sparse_hessian(a, b, p, total, flat, e0, e1, tau)
                        row[2] += b - a
                        row[3] += kept
                        row[HEAD + k_num :] += h
                rows.append(row)
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
        out = torch.zeros(1 + self.num_k, dtype=torch.float64, device=self.device)
        for a, b, x, flat, e0, e1 in self._sparse_allocations(inv):
            out[0] += (x * self.problem.revenue[a:b]).double().sum()
            out[1:].index_add_(
                0, self.kk[e0:e1], self.vals[e0:e1].double() * x.view(-1)[flat].double()
            )
        return out.cpu()

    def allocation(self, inv_rho: torch.Tensor) -> torch.Tensor:
        """The repaired primal ``x (n, m)`` at the last evaluated point, in the compute dtype."""
        inv = inv_rho.to(self.device, torch.float64)
        x = torch.empty(self.n, self.m, dtype=self.dtype, device=self.device)
        if self.factorised:
            assert self._last is not None
            return self._f.allocation(self._last[0], self._last[1], inv)
        else:
            for a, b, xa, *_ in self._sparse_allocations(inv):
                x[a:b] = xa
        return x

    # -- chunk kernels ---------------------------------------------------------------------

    def _sampled(self, a: int, stride: int) -> bool:
        return ((self.offset + a) // self.chunk) % stride == 0

    def _soft_sparse(
        self, a: int, b: int, lam_c: torch.Tensor, tau: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, torch.Tensor]:
        e0, e1 = self.ptr[a], self.ptr[b]
        flat = self.flat[e0:e1] - a * self.m
        r = self.problem.revenue[a:b].clone()
        r.view(-1).index_add_(0, flat, self.vals[e0:e1] * lam_c[self.kk[e0:e1]], alpha=-1)
        p, lse, best, total = softmax_with_null(r, tau)
        return p, lse, best, flat, e0, e1, total

    def _sparse_hessian(
        self,
        a: int,
        b: int,
        p: torch.Tensor,
        total: torch.Tensor,
        flat: torch.Tensor,
        e0: int,
        e1: int,
        tau: float,
    ) -> tuple[int, torch.Tensor]:
        """Users summed and ``sum_i Cov_{p_i}(m_i) / tau`` over users ``[a, b)``.

        As in the factorised form, users whose choice is within ``HESSIAN_SPREAD`` of one-hot
        are left out, and so are entries of probability below ``SPARSE_P_FLOOR`` (both below
        float32's rounding of the rest): the second moment is then one dense product over the
        few ``(user, item)`` rows left, ``D^T diag(p) D``.
        """
        k_num, m = self.num_k, self.m
        keep_u = total > 1.0 + HESSIAN_SPREAD
        kept = int(keep_u.sum())
        out = torch.zeros(k_num * k_num, dtype=torch.float64, device=self.device)
        if kept == 0:
            return 0, out
        pf = p.view(-1)
        pe = pf[flat]
        user = torch.div(flat, m, rounding_mode="floor")
        es = (keep_u[user] & (pe > SPARSE_P_FLOOR)).nonzero().squeeze(1)
        if es.numel() == 0:
            return kept, out
        f, k, v = flat[es], self.kk[e0:e1][es], self.vals[e0:e1][es]
        mu = torch.zeros((b - a) * k_num, dtype=self.dtype, device=self.device)
        mu.index_add_(0, user[es] * k_num + k, v * pe[es])
        mu_k = mu.view(b - a, k_num)[keep_u]
        # entries are sorted by (user, item): consecutive runs share a row of D
        rows_f, inv = torch.unique_consecutive(f, return_inverse=True)
        dense = torch.zeros(rows_f.numel() * k_num, dtype=self.dtype, device=self.device)
        dense[inv * k_num + k] = v
        dense = dense.view(-1, k_num)
        t1 = (dense * pf[rows_f][:, None]).T @ dense
        out += (t1 - mu_k.T @ mu_k).double().reshape(-1)
        return kept, out / tau

    def _sparse_allocations(self, inv: torch.Tensor):  # type: ignore[no-untyped-def]
        assert self._last is not None
        lam, tau = self._last
        lam_c, inv_c = lam.to(self.dtype), inv.to(self.dtype)
        for a in range(0, self.n, self.chunk):
            b = min(a + self.chunk, self.n)
            p, _, _, flat, e0, e1, _ = self._soft_sparse(a, b, lam_c, tau)
            sigma = torch.ones(p.numel(), dtype=self.dtype, device=self.device)
            sigma.scatter_reduce_(0, flat, inv_c[self.kk[e0:e1]], reduce="amin")
            yield a, b, p * sigma.view_as(p), flat, e0, e1
