"""The factorised pass: a :class:`~eventbus.solver._kernel.Partition`'s work when consumption is a
:class:`FactorisedConsumption`.

Resources are grouped by the weight they count in (``groups``: a named ``(n, m)`` weight or
``count``). At duals ``lam`` each group has item prices ``pi_L = (S_L * lam_L)^T @ A_L`` of shape
``(G, m)``, and the reduced costs are ``r = c - sum_L W_L * pi_L[segment]``: one fused
multiply-subtract over the chunk per group, whatever ``K``. Usage comes back through per-segment
sums ``q_L[g, j] = sum_{i in g} p_ij W_L[i, j]`` (one ``(G, chunk) @ (chunk, m)`` product per
group; an ``index_add`` above ``ONEHOT_MAX_SEGMENTS`` segments), and the Newton metric through
``q_LL'[g, j] = sum p W_L W_L'`` for each pair of groups. The prices, the usage and the
repair's caps go over the listed (segment, item, resource) triples (``_Cells``, up to
``CELL_ENTRIES`` of them) instead of dense ``K x m x G`` products: at K = 10,000, 3e4 triples.
"""

from __future__ import annotations

import torch

from eventbus.solver._factorised import FactorisedConsumption
from eventbus.solver._problem import AllocationProblem
from eventbus.solver._softmax import softmax_with_null

__all__ = ["FactorisedPass"]

ONEHOT_MAX_SEGMENTS = 16  # more segments: per-segment sums by index_add, not one-hot products


class FactorisedPass:
    """Chunked passes over the users of a factorised problem (see the module docstring).

    Args:
        problem: the (sub-)problem; its consumption must be a :class:`FactorisedConsumption`.
        chunk: users per chunk.
        block: users per reduction block (a multiple of ``chunk``).
    """

    def __init__(self, problem: AllocationProblem, chunk: int, block: int) -> None:
        cons = problem.consumption
        assert isinstance(cons, FactorisedConsumption)
        self.cons = cons
        self.rev = problem.revenue
        self.n, self.m = problem.revenue.shape
        self.dtype = problem.revenue.dtype
        self.device = problem.revenue.device
        self.chunk, self.block = chunk, block
        self.k_num = cons.num_resources
        self.g_num = cons.num_segments
        self.seg = cons.segment.long()
        self.w64 = cons.item_cost.to(torch.float64)
        self.s64 = cons.segment_mask.to(torch.float64)
        self.st_c = self.s64.T.to(self.dtype).contiguous()  # (G, K)
        self.rows = [rows.to(self.device) for _, rows in cons.groups]
        self.weights: list[torch.Tensor | None] = []
        for name, _ in cons.groups:
            w = cons.weight_of(name)
            self.weights.append(None if w is None else w.to(self.dtype))
        self.ic64 = [self.w64[r] for r in self.rows]
        self.sm64 = [self.s64[r] for r in self.rows]
        self.ic_c = [ic.to(self.dtype) for ic in self.ic64]
        n_groups = len(self.rows)
        self.pairs = [(a, b) for a in range(n_groups) for b in range(a, n_groups)]
        self.cells = _Cells.build(cons, self.w64, self.s64, self.device, n_groups)
        self.q: list[torch.Tensor] = []
        self.v: torch.Tensor | None = None

    # -- passes ----------------------------------------------------------------------------

    def evaluate(
        self,
        lam: torch.Tensor,
        tau: float,
        stride: int,
        sampled: object,
        head_width: int,
        spread: float,
    ) -> list[torch.Tensor]:
        """Rows as :meth:`Partition.evaluate` documents them; ``sampled(a, stride)`` picks the
        chunks the Newton metric sums (``stride > 0``)."""
        assert callable(sampled)
        hessian = stride > 0
        k_num, g_num = self.k_num, self.g_num
        dev = self.device
        pis = self._prices(lam)
        self.q = [torch.zeros(g_num, self.m, dtype=torch.float64, device=dev) for _ in pis]
        self.v = torch.zeros(g_num, self.m, dtype=torch.float64, device=dev)
        rows = []
        for b0 in range(0, self.n, self.block):
            head = torch.zeros(head_width, dtype=torch.float64, device=dev)
            q_blk = [torch.zeros_like(self.v) for _ in pis]
            q2_blk = [torch.zeros_like(self.v) for _ in self.pairs] if hessian else []
            t2 = torch.zeros(k_num, k_num, dtype=torch.float64, device=dev) if hessian else None
            for a in range(b0, min(b0 + self.block, self.n), self.chunk):
                b = min(a + self.chunk, self.n)
                p, lse, best, total = self.soft(a, b, pis, tau)
                wps = [p if w is None else p * w[a:b] for w in self.weights]
                for qb, wp in zip(q_blk, wps):
                    qb += self._segment_sums(a, b, wp)
                self.v += self._segment_sums(a, b, p * self.rev[a:b])
                head[0] += lse.double().sum()
                head[1] += best.double().sum()
                if t2 is not None and sampled(a, stride):
                    head[2] += b - a
                    # users whose likeliest option has probability > 1 - spread add a
                    # covariance below the rounding of the others': skip them
                    keep = (total > 1.0 + spread).nonzero().squeeze(1)
                    head[3] += keep.numel()
                    if keep.numel():
                        t2 += self._metric_chunk(a, b, keep, p, wps, q2_blk)
            for q, qb in zip(self.q, q_blk):
                q += qb
            parts = [head, self._usage(q_blk)]
            if t2 is not None:
                parts.append(((self._second_moment(q2_blk) - t2) / tau).reshape(-1))
            rows.append(torch.cat(parts))
        return rows

    def primal(self, inv: torch.Tensor) -> torch.Tensor:
        """``[value, usage (K)]`` of the repaired primal at the last evaluated point."""
        assert self.v is not None
        sigma = self.sigma(inv)
        value = (sigma * self.v).sum()
        usage = self._usage([sigma * q for q in self.q])
        return torch.cat([value.reshape(1), usage])

    def allocation(self, lam: torch.Tensor, tau: float, inv: torch.Tensor) -> torch.Tensor:
        """The repaired primal ``x (n, m)`` at ``(lam, tau)``, in the compute dtype."""
        x = torch.empty(self.n, self.m, dtype=self.dtype, device=self.device)
        pis = self._prices(lam)
        sigma = self.sigma(inv).to(self.dtype)
        for a in range(0, self.n, self.chunk):
            b = min(a + self.chunk, self.n)
            x[a:b] = self.soft(a, b, pis, tau)[0] * sigma[self.seg[a:b]]
        return x

    # -- pieces ----------------------------------------------------------------------------

    def _prices(self, lam: torch.Tensor) -> list[torch.Tensor]:
        lam = lam.to(self.device, torch.float64)
        if self.cells is not None:
            return [pi.to(self.dtype) for pi in self.cells.prices(lam, self.g_num, self.m)]
        return [
            ((sm * lam[r][:, None]).T @ ic).to(self.dtype)
            for r, sm, ic in zip(self.rows, self.sm64, self.ic64)
        ]

    def soft(
        self, a: int, b: int, pis: list[torch.Tensor], tau: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Smoothed choice of users ``[a, b)`` (see ``softmax_with_null``)."""
        seg = self.seg[a:b]
        r: torch.Tensor | None = None
        for w, pi in zip(self.weights, pis):
            t = pi.index_select(0, seg)
            if r is None:
                if w is not None:
                    t.mul_(w[a:b])
                r = torch.sub(self.rev[a:b], t, out=t)
            elif w is not None:
                r.addcmul_(t, w[a:b], value=-1)
            else:
                r.sub_(t)
        if r is None:
            r = self.rev[a:b].clone()
        return softmax_with_null(r, tau)

    def _metric_chunk(
        self,
        a: int,
        b: int,
        keep: torch.Tensor,
        p: torch.Tensor,
        wps: list[torch.Tensor],
        q2_blk: list[torch.Tensor],
    ) -> torch.Tensor:
        """Adds the kept users' ``sum p W_L W_L'`` to ``q2_blk``; returns their ``sum mu mu^T``."""
        seg_k = self.seg[a:b].index_select(0, keep)
        onehot = torch.nn.functional.one_hot(seg_k, self.g_num).T.to(self.dtype)
        wps_k = [wp.index_select(0, keep) for wp in wps]
        ws_k = [None if w is None else w[a:b].index_select(0, keep) for w in self.weights]
        p_k: torch.Tensor | None = None
        for out, (x, y) in zip(q2_blk, self.pairs):
            if ws_k[x] is None and ws_k[y] is None:
                if p_k is None:
                    p_k = p.index_select(0, keep)
                prod = p_k
            elif ws_k[x] is None:
                prod = wps_k[y]
            else:
                wy = ws_k[y]
                prod = wps_k[x] if wy is None else wps_k[x] * wy
            out += (onehot @ prod).double()
        mu = torch.empty(keep.numel(), self.k_num, dtype=self.dtype, device=self.device)
        for rows, wp, ic in zip(self.rows, wps_k, self.ic_c):
            mu[:, rows] = wp @ ic.T
        mu.mul_(self.st_c.index_select(0, seg_k))  # (users kept, K)
        return (mu.T @ mu).double()

    def _segment_sums(self, a: int, b: int, x: torch.Tensor) -> torch.Tensor:
        """``(G, m)`` float64 sums of ``x``'s rows (users ``[a, b)``) per segment: a one-hot
        product for few segments, an index_add for many (the product costs ``G`` times the
        data)."""
        seg = self.seg[a:b]
        if self.g_num <= ONEHOT_MAX_SEGMENTS:
            onehot = torch.nn.functional.one_hot(seg, self.g_num).T.to(self.dtype)
            return (onehot @ x).double()
        out = torch.zeros(self.g_num, self.m, dtype=self.dtype, device=self.device)
        return out.index_add_(0, seg, x).double()

    def _usage(self, q: list[torch.Tensor]) -> torch.Tensor:
        usage = torch.zeros(self.k_num, dtype=torch.float64, device=self.device)
        if self.cells is not None:
            return self.cells.usage(q, usage)
        for rows, qg, ic, sm in zip(self.rows, q, self.ic64, self.sm64):
            usage[rows] = ((ic @ qg.T) * sm).sum(1)
        return usage

    def _second_moment(self, q2: list[torch.Tensor]) -> torch.Tensor:
        k_num = self.k_num
        t1 = torch.zeros(k_num, k_num, dtype=torch.float64, device=self.device)
        for q2g, (x, y) in zip(q2, self.pairs):
            rx, ry = self.rows[x], self.rows[y]
            blk = torch.zeros(rx.numel(), ry.numel(), dtype=torch.float64, device=self.device)
            for g in range(self.g_num):
                ax = self.ic64[x] * self.sm64[x][:, g : g + 1]
                ay = self.ic64[y] * self.sm64[y][:, g : g + 1]
                blk += (ax * q2g[g]) @ ay.T
            t1[rx[:, None], ry[None, :]] += blk
            if x != y:
                t1[ry[:, None], rx[None, :]] += blk.T
        return t1

    def sigma(self, inv: torch.Tensor) -> torch.Tensor:
        """The least ``inv[k]`` over the resources each (segment, item) consumes, 1 if none."""
        # resources in groups of about 1M (segment, item) entries
        inv = inv.to(self.device, torch.float64)
        g_num = self.g_num
        if self.cells is not None:
            return self.cells.sigma(inv).view(g_num, self.m)
        sigma = torch.ones(g_num, self.m, dtype=torch.float64, device=self.device)
        over = (inv < 1).nonzero().flatten()
        step = max(1, (1 << 20) // max(1, g_num * self.m))
        one = torch.ones((), dtype=torch.float64, device=self.device)
        for a in range(0, over.numel(), step):
            ks = over[a : a + step]
            hit = (self.s64[ks] > 0)[:, :, None] & (self.w64[ks] > 0)[:, None, :]
            cap = torch.where(hit, inv[ks][:, None, None], one)
            sigma = torch.minimum(sigma, cap.amin(0))
        return sigma


CELL_ENTRIES = 1 << 24  # (segment, item, resource) triples above which the dense products run


class _Cells:
    """The resources of each (segment, item) cell, listed (``_tosparse.cell_rows``): prices,
    usage and the repair's caps as gathers and scatters over the listed triples, ``O(triples)``
    instead of the dense ``O(K G m)`` products (K = 10,000: 3e4 triples against 1e8 products)."""

    def __init__(
        self,
        ptr: torch.Tensor,
        cell: torch.Tensor,
        ks: torch.Tensor,
        coef: torch.Tensor,
        groups: list[torch.Tensor],
    ) -> None:
        self.ptr, self.cell, self.ks, self.coef, self.groups = ptr, cell, ks, coef, groups

    @classmethod
    def build(
        cls,
        cons: FactorisedConsumption,
        w64: torch.Tensor,
        s64: torch.Tensor,
        device: torch.device,
        n_groups: int,
    ) -> _Cells | None:
        from eventbus.solver._tosparse import cell_rows

        found = cell_rows(cons, CELL_ENTRIES)
        if found is None:
            return None
        ptr, cell, ks, grp = found
        m = w64.shape[1]
        g = torch.div(cell, m, rounding_mode="floor")
        coef = w64.cpu()[ks, cell.remainder(m)] * s64.cpu()[ks, g]
        groups = [(grp == gi).nonzero().squeeze(1).to(device) for gi in range(n_groups)]
        return cls(ptr.to(device), cell.to(device), ks.to(device), coef.to(device), groups)

    def prices(self, lam: torch.Tensor, g_num: int, m: int) -> list[torch.Tensor]:
        """``pi_L (G, m)`` float64 per group: ``sum_k lam_k * item_cost[k, j] * mask[k, g]``."""
        out = []
        for sel in self.groups:
            vals = self.coef.index_select(0, sel) * lam.index_select(
                0, self.ks.index_select(0, sel)
            )
            pi = torch.zeros(g_num * m, dtype=torch.float64, device=lam.device)
            out.append(pi.index_add_(0, self.cell.index_select(0, sel), vals).view(g_num, m))
        return out

    def usage(self, q: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """``out += sum over cells of coef * q_L[cell]`` per resource (``q``: per group ``(G, m)``)."""
        for sel, qg in zip(self.groups, q):
            vals = self.coef.index_select(0, sel) * qg.reshape(-1).index_select(
                0, self.cell.index_select(0, sel)
            )
            out.index_add_(0, self.ks.index_select(0, sel), vals)
        return out

    def sigma(self, inv: torch.Tensor) -> torch.Tensor:
        """Per cell, the least ``inv`` over its resources (1 if none), ``(G * m,)``."""
        return torch.segment_reduce(
            inv.index_select(0, self.ks), "min", offsets=self.ptr, initial=1.0, unsafe=True
        ).clamp_max_(1.0)
