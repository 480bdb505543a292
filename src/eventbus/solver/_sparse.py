"""The sparse pass: a :class:`~eventbus.solver._kernel.Partition`'s work when consumption is a
sparse ``(n, m, K)`` tensor.

The entries are held as a CSR matrix ``M`` of shape ``(n * m, K)``: one row per (user, item),
sorted as the coalesced COO tensor already is, with a row pointer built once. At duals ``lam``
the reduced costs of a chunk are ``r = c - M_chunk @ lam`` and its usage is ``M_chunk^T @ p``:
two sparse matrix-vector products per chunk (scipy's compiled CSR and CSC kernels on the CPU,
float64 accumulation, no transposed copy), instead of index scatters over ``(n, m, K)`` entries.
Rows whose K-vector is a scalar times one of few patterns are compressed (see
:mod:`eventbus.solver._patterns`), per reduction block so that partitions on block boundaries
compress alike: their part of both products is a gather and a histogram over ``(n, m)``,
whatever ``K``, or, when the block's users repeat few rows of pattern ids (user classes, see
:mod:`eventbus.solver._classes`), the factorised form's row gathers and ``onehot @`` products.

The last pass's choice ``p`` is kept per chunk, so the repaired primal after an accepted step
costs one product, not a softmax pass. Explicit zeros in the tensor are dropped (they consume
nothing). Other devices (CUDA) use index scatters over the entries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from eventbus.solver._patterns import RowPatterns, find_patterns
from eventbus.solver._problem import AllocationProblem
from eventbus.solver._softmax import softmax_with_null

__all__ = ["SPARSE_P_FLOOR", "SparsePass"]

# The sparse Hessian leaves out entries of probability below this.
SPARSE_P_FLOOR = 1e-7


class _Chunk:
    """Users ``[a, b)``: their entries ``[e0, e1)`` and the CSR blocks of the general rows."""

    def __init__(self, a: int, b: int, e0: int, e1: int) -> None:
        self.a, self.b, self.e0, self.e1 = a, b, e0, e1
        self.csr: Any = None  # scipy csr_matrix of the rows that do not compress
        self.general = True  # whether the chunk has general (not compressed) rows
        self.pat: RowPatterns | None = None  # its block's compressed rows
        self.base = 0  # the block's first row (pattern rows are numbered from it)
        self.ebase = 0  # the block's first entry
        self.sigma_index: tuple[torch.Tensor, torch.Tensor] | None = None  # CSR ptr, kk (long)


class SparsePass:
    """Chunked passes over the users of a problem with sparse consumption (module docstring).

    Args:
        problem: the (sub-)problem; its consumption must be a sparse COO ``(n, m, K)`` tensor.
        chunk: users per chunk.
        block: users per reduction block (a multiple of ``chunk``).
        compress: look for rows that are scalars times one of few patterns (CPU only).
        scipy: use scipy's CSR kernels (default: on the CPU); else index scatters (any device).
    """

    def __init__(
        self,
        problem: AllocationProblem,
        chunk: int,
        block: int,
        *,
        compress: bool = True,
        scipy: bool | None = None,
    ) -> None:
        # built on one CPU thread: its ops are short and memory-bound, and an op split over
        # threads waits for the slowest when other processes share the cores (2-6x the time)
        threads = torch.get_num_threads()
        one = problem.revenue.device.type == "cpu" and threads > 1
        if one:
            torch.set_num_threads(1)
        try:
            self._build(problem, chunk, block, compress, scipy)
        finally:
            if one:
                torch.set_num_threads(threads)

    def _build(
        self,
        problem: AllocationProblem,
        chunk: int,
        block: int,
        compress: bool,
        scipy: bool | None,
    ) -> None:
        cons = problem.consumption
        assert isinstance(cons, torch.Tensor)
        self.rev = problem.revenue
        self.n, self.m = problem.revenue.shape
        self.dtype = problem.revenue.dtype
        self.device = problem.revenue.device
        self.chunk, self.block = chunk, block
        self.k_num = int(cons.shape[2])
        idx, vals = cons.indices(), cons.values()
        nz = vals != 0
        if not bool(nz.all()):
            idx, vals = idx[:, nz], vals[nz]
        m = self.m
        self.flat = idx[0] * m + idx[1]  # (user, item) row of each entry, sorted
        self.kk = idx[2].contiguous()
        self.vals = vals.to(self.dtype)
        counts = torch.bincount(self.flat, minlength=self.n * m)
        self.rowptr = torch.zeros(self.n * m + 1, dtype=torch.long, device=self.device)
        torch.cumsum(counts, 0, out=self.rowptr[1:])
        self.cpu = self.device.type == "cpu" if scipy is None else scipy
        # patterns are found per reduction block: partitions start on block boundaries, so a
        # partitioned solve compresses the same rows the same way as a local one
        self.pats: list[RowPatterns | None] = []
        self.chunks: list[_Chunk] = []
        for b0 in range(0, self.n, block):
            b1 = min(b0 + block, self.n)
            f0, f1 = self.rowptr[[b0 * m, b1 * m]].tolist()
            pat = None
            if self.device.type == "cpu" and compress:
                # (no copies when the block starts at 0: one block up to ~2M rows)
                ptr, row_of = self.rowptr[b0 * m : b1 * m + 1], self.flat[f0:f1]
                pat = find_patterns(
                    ptr - f0 if f0 else ptr,
                    row_of - b0 * m if b0 else row_of,
                    self.kk[f0:f1],
                    self.vals[f0:f1],
                    self.k_num,
                    m,
                )
            self.pats.append(pat)
            for a in range(b0, b1, chunk):
                b = min(a + chunk, b1)
                e0, e1 = self.rowptr[[a * m, b * m]].tolist()
                c = _Chunk(a, b, e0, e1)
                c.pat, c.base, c.ebase = pat, b0 * m, f0
                if pat is not None:
                    c.general = bool(pat.general_rows[a * m - c.base : b * m - c.base].any())
                if self.cpu and c.general:
                    c.csr = self._csr(c)
                self.chunks.append(c)
        self.p: list[torch.Tensor] = []  # the last pass's choice, of chunks with general rows
        self.hists: list[torch.Tensor | None] = []  # the last pass's per-pattern sums, per block
        self._sums: torch.Tensor | None = None  # a block's pattern sums for the metric

    def _csr(self, c: _Chunk) -> Any:
        from scipy.sparse import csr_matrix

        r0, r1 = c.a * self.m, c.b * self.m
        ptr = self.rowptr[r0 : r1 + 1] - c.e0
        kk, vals = self.kk[c.e0 : c.e1], self.vals[c.e0 : c.e1].double()
        if c.pat is not None:  # the compressed rows' entries are left out
            general = c.pat.general_entries[c.e0 - c.ebase : c.e1 - c.ebase]
            kk, vals = kk[general], vals[general]
            lengths = self.rowptr[r0 + 1 : r1 + 1] - self.rowptr[r0:r1]
            ptr = torch.zeros_like(ptr)
            rows = c.pat.general_rows[r0 - c.base : r1 - c.base]
            torch.cumsum(rows.long() * lengths, 0, out=ptr[1:])
        return csr_matrix(
            (vals.numpy(), kk.to(torch.int32).numpy(), ptr.to(torch.int32).numpy()),
            shape=(r1 - r0, self.k_num),
        )

    # -- passes ----------------------------------------------------------------------------

    def evaluate(
        self,
        lam: torch.Tensor,
        tau: float,
        stride: int,
        sampled: Callable[[int, int], bool],
        head_width: int,
        spread: float,
    ) -> list[torch.Tensor]:
        """Rows as :meth:`Partition.evaluate` documents them."""
        hessian = stride > 0
        k_num = self.k_num
        width = head_width + k_num + (k_num * k_num if hessian else 0)
        lam64 = lam.to(self.device, torch.float64)
        self.p = []
        self.hists = []
        rows = []
        per_block = self.block // self.chunk
        for bi, pat in enumerate(self.pats):
            row = torch.zeros(width, dtype=torch.float64, device=self.device)
            self._sums = None
            prices = None if pat is None else pat.prices(lam64)
            hist_b: torch.Tensor | None = None
            for c in self.chunks[bi * per_block : (bi + 1) * per_block]:
                p, lse, best, total = softmax_with_null(self._reduced(c, lam64, prices), tau)
                row[0] += lse.double().sum()
                row[1] += best.double().sum()
                use = row[head_width : head_width + k_num]
                pf = p.view(-1)
                if pat is not None:
                    r0, r1 = c.a * self.m - c.base, c.b * self.m - c.base
                    hist = pat.histograms(pf, self.rev[c.a : c.b].reshape(-1), r0, r1)
                    hist_b = hist if hist_b is None else hist_b.add_(hist)
                if c.general:
                    use += self._general_usage(c, pf)
                    self.p.append(p)
                if hessian and sampled(c.a, stride):
                    kept, h = self._hessian(c, p, total, tau, spread)
                    row[2] += c.b - c.a
                    row[3] += kept
                    row[head_width + k_num :] += h
            if pat is not None and hist_b is not None:  # one product per block
                row[head_width : head_width + k_num] += pat.usage(hist_b)
            if self._sums is not None and pat is not None:
                t1 = pat.second_moment(self._sums)
                row[head_width + k_num :] += (t1 / tau).reshape(-1)
            self.hists.append(hist_b)
            rows.append(row)
        return rows

    def primal(self, inv: torch.Tensor) -> torch.Tensor:
        """``[value, usage (K)]`` of the repaired primal at the last evaluated point."""
        inv64 = inv.to(self.device, torch.float64)
        out = torch.zeros(1 + self.k_num, dtype=torch.float64, device=self.device)
        for pat, hist in zip(self.pats, self.hists):
            if pat is not None and hist is not None:
                sig = pat.sigma(inv64)
                npat = pat.num_patterns
                out[0] += (sig[:npat] * hist[0, :npat]).sum()
                out[1:] += pat.usage(hist, sig)
        for c, p in zip([c for c in self.chunks if c.general], self.p):
            x = p.view(-1) * self._general_sigma(c, inv64)
            if c.pat is not None:  # the compressed rows are in the histograms
                x = x * c.pat.general_rows[c.a * self.m - c.base : c.b * self.m - c.base]
            out[0] += (x * self.rev[c.a : c.b].reshape(-1)).double().sum()
            out[1:] += self._general_usage(c, x)
        return out

    def allocation(self, lam: torch.Tensor, tau: float, inv: torch.Tensor) -> torch.Tensor:
        """The repaired primal ``x (n, m)`` at ``(lam, tau)``, in the compute dtype."""
        x = torch.empty(self.n, self.m, dtype=self.dtype, device=self.device)
        lam64 = lam.to(self.device, torch.float64)
        inv64 = inv.to(self.device, torch.float64)
        for c in self.chunks:
            prices = None if c.pat is None else c.pat.prices(lam64)
            p = softmax_with_null(self._reduced(c, lam64, prices), tau)[0]
            sig = self._general_sigma(c, inv64) if c.general else None
            if c.pat is not None:
                pid = c.pat.pid[c.a * self.m - c.base : c.b * self.m - c.base]
                sp = c.pat.sigma(inv64).index_select(0, pid)
                sig = sp if sig is None else torch.minimum(sig, sp)
            x[c.a : c.b] = p if sig is None else p * sig.to(self.dtype).view_as(p)
        return x

    # -- pieces ----------------------------------------------------------------------------

    def _reduced(
        self, c: _Chunk, lam64: torch.Tensor, prices: list[torch.Tensor] | None
    ) -> torch.Tensor:
        """``r = c - M @ lam`` over the chunk, a fresh ``(users, m)`` tensor."""
        r0 = c.a * self.m
        r = self.rev[c.a : c.b].clone()
        rf = r.view(-1)
        if prices is not None and c.pat is not None:
            c.pat.subtract_prices(rf, prices, r0 - c.base, c.b * self.m - c.base)
        if not c.general:
            return r
        if self.cpu:
            price = c.csr @ lam64.numpy()
            rf.sub_(torch.from_numpy(price).to(self.dtype))
        else:
            ks = self.kk[c.e0 : c.e1]
            pv = self.vals[c.e0 : c.e1] * lam64.to(self.dtype)[ks]
            rf.index_add_(0, self.flat[c.e0 : c.e1] - r0, pv, alpha=-1)
        return r

    def _general_usage(self, c: _Chunk, x: torch.Tensor) -> torch.Tensor:
        """The general rows' ``M^T @ x`` in float64 (``x``: the chunk's ``(users * m,)``)."""
        if not self.cpu:
            pv = self.vals[c.e0 : c.e1] * x[self.flat[c.e0 : c.e1] - c.a * self.m]
            out = torch.zeros(self.k_num, dtype=torch.float64, device=self.device)
            return out.index_add_(0, self.kk[c.e0 : c.e1], pv.double())
        return torch.from_numpy(c.csr.T @ x.double().numpy())

    def _general_sigma(self, c: _Chunk, inv64: torch.Tensor) -> torch.Tensor:
        """Per row of the chunk, the least ``inv`` over the general entries (1 if none)."""
        if self.cpu:
            if c.sigma_index is None:  # (kept: a conversion per pass costs as much as the min)
                c.sigma_index = (
                    torch.from_numpy(c.csr.indptr).long(),
                    torch.from_numpy(c.csr.indices).long(),
                )
            ptr, kk = c.sigma_index
        else:
            ptr = self.rowptr[c.a * self.m : c.b * self.m + 1] - c.e0
            kk = self.kk[c.e0 : c.e1]
        return torch.segment_reduce(inv64[kk], "min", offsets=ptr, initial=1.0, unsafe=True)

    def _hessian(
        self, c: _Chunk, p: torch.Tensor, total: torch.Tensor, tau: float, spread: float
    ) -> tuple[int, torch.Tensor]:
        """Users summed and ``sum_i Cov_{p_i}(m_i) / tau`` over the chunk's users.

        As in the factorised form, users whose choice is within ``spread`` of one-hot are left
        out, and so are rows of probability below ``SPARSE_P_FLOOR`` (both below float32's
        rounding of the rest). The kept users' compressed rows add per-pattern sums to
        the block's (``second_moment`` turns them into ``sum p v v^T`` once per block) and
        ``mu`` by one CSR product; the general rows' second moment is one dense product over the few
        ``(user, item)`` rows left, ``D^T diag(p) D``.
        """
        k_num, m = self.k_num, self.m
        keep_u = total > 1.0 + spread
        kept = int(keep_u.sum())
        if kept == 0:
            return 0, torch.zeros(k_num * k_num, dtype=torch.float64, device=self.device)
        t1 = torch.zeros(k_num, k_num, dtype=torch.float64, device=self.device)
        pf = p.view(-1)
        # per user means in the compute dtype (as the factorised form's): a metric, not a bound
        mu_k = torch.zeros(kept, k_num, dtype=self.dtype, device=self.device)
        if c.pat is not None:
            # general rows are the zero pattern's, with scale 0
            keep = keep_u.nonzero().squeeze(1)
            r0 = c.a * m - c.base
            sums, mu_p = c.pat.moments(p.index_select(0, keep), keep, r0, SPARSE_P_FLOOR)
            self._sums = sums if self._sums is None else self._sums.add_(sums)
            mu_k += mu_p
        if c.general:
            flat = self.flat[c.e0 : c.e1] - c.a * m
            pe = pf[flat]
            user = torch.div(flat, m, rounding_mode="floor")
            take = keep_u[user] & (pe > SPARSE_P_FLOOR)
            if c.pat is not None:
                take &= c.pat.general_entries[c.e0 - c.ebase : c.e1 - c.ebase]
            es = take.nonzero().squeeze(1)
            if es.numel():
                f, k, v = flat[es], self.kk[c.e0 : c.e1][es], self.vals[c.e0 : c.e1][es]
                kept_no = (torch.cumsum(keep_u, 0) - 1)[user[es]]
                mu_k.view(-1).index_add_(0, kept_no * k_num + k, (v * pe[es]).to(self.dtype))
                # entries are sorted by (user, item): consecutive runs share a row of D
                rows_f, inv = torch.unique_consecutive(f, return_inverse=True)
                dense = torch.zeros(rows_f.numel() * k_num, dtype=self.dtype, device=self.device)
                dense[inv * k_num + k] = v
                dense = dense.view(-1, k_num)
                t1 += ((dense * pf[rows_f][:, None]).T @ dense).double()
        return kept, ((t1 - (mu_k.T @ mu_k).double()) / tau).reshape(-1)
