"""Row patterns: the (user, item) rows of a sparse consumption that are scalars times one of few
K-vectors, found when the pass is built.

Coupon problems are usually made this way: a money budget's coefficient is a per-(user, item)
expected cost times the item's face value on the budget's item subset and user segment, so a
row's budget entries are ``scale[i, j] * pattern[segment(i), j]``; an inventory counts coupons
with one coefficient. Resources are split into two groups: those whose every entry has the same
value (counts: one coefficient per resource, scale 1) and the others, whose scale is the row's
sum of its values there (in float64). A row's entries divided by their group's scale give its
pattern; rows whose patterns are equal (one hash over all the entries, then checked entry by
entry) share one pattern id (:mod:`eventbus.solver._rowkeys`: ids from a sampled key table, no
sort). A row compresses when each of its ratios is the pattern's to within ``8 * eps`` of the
compute dtype (relative: the data's own rounding) on the same set of resources, and another row
shares its pattern; a hash collision only makes rows general. Rows that do not stay general
(the CSR product); when more than ``MAX_PATTERN_SHARE`` of the rows would need shared patterns
of their own, or more than half of the rows stay general, nothing is compressed.

For compressed rows a pass needs, per group, ``prices = P @ lam`` (one small product), the
reduced cost ``scale * prices[pid]`` (a gather over ``(n, m)``) and per-pattern sums
``sum p * scale`` (a histogram): ``O(n * m)`` whatever ``K``, as the factorised form. The
repaired primal and its usage then come from the histograms alone. When a block's users repeat
few rows of pattern ids (:mod:`eventbus.solver._classes`), the gather and the histogram become
the factorised form's row gathers and ``onehot @`` products.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eventbus.solver._classes import UserClasses, find_classes, merge_split
from eventbus.solver._rowkeys import key_ids, row_keys

__all__ = ["MAX_PATTERN_ENTRIES", "MAX_PATTERN_SHARE", "RowPatterns", "find_patterns"]

MAX_PATTERN_SHARE = 1 / 16  # more patterns than this share of the rows: no compression
MAX_PATTERN_ENTRIES = 1 << 24  # nor when patterns x K would exceed this (128 MB per group)


@dataclass
class RowPatterns:
    """The compressed rows of one pass (see the module docstring).

    ``pid`` is each row's pattern, ``num_patterns`` for general rows (a zero pattern);
    ``scales[g]`` and ``patterns[g]`` (``(num_patterns + 1, K)`` float64) are group ``g``'s.
    """

    pid: torch.Tensor
    scales: list[torch.Tensor]
    patterns: list[torch.Tensor]
    general_rows: torch.Tensor  # (rows,) bool: rows left to the general CSR product
    general_entries: torch.Tensor  # (nnz,) bool: their entries
    unit: list[bool]  # per group: its scale is 1 on every compressed row (counts)
    classes: UserClasses | None = None  # the block's user classes, if few (see _classes)

    def _scales(self, r0: int, r1: int) -> list[torch.Tensor | None]:
        """Each group's scales over rows ``[r0, r1)``, ``None`` for a unit group (general rows
        have the zero pattern: their scale does not matter)."""
        return [None if u else s[r0:r1] for s, u in zip(self.scales, self.unit)]

    @property
    def num_patterns(self) -> int:
        """Patterns (not counting the general rows' bin)."""
        return int(self.patterns[0].shape[0]) - 1

    def prices(self, lam64: torch.Tensor) -> list[torch.Tensor]:
        """``P_g @ lam`` per group, in the compute dtype of the scales."""
        return [(p @ lam64).to(s.dtype) for p, s in zip(self.patterns, self.scales)]

    def subtract_prices(
        self, rf: torch.Tensor, prices: list[torch.Tensor], r0: int, r1: int
    ) -> None:
        """``rf -= sum_g scale_g * prices_g[pid]`` over rows ``[r0, r1)`` (``rf``: those rows)."""
        scales = self._scales(r0, r1)
        cl = self.classes
        if cl is not None:
            m = cl.m
            shaped = [None if s is None else s.view(-1, m) for s in scales]
            cl.subtract_prices(rf.view(-1, m), prices, shaped, r0 // m)
            return
        pid = self.pid[r0:r1]
        for s, pr in zip(scales, prices):
            if s is None:
                rf.sub_(pr.index_select(0, pid))
            else:
                rf.addcmul_(pr.index_select(0, pid), s, value=-1)

    def histograms(self, x: torch.Tensor, rev: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        """Per pattern: ``[sum x * c, sum x * scale_g (per group)]``, ``(1 + G, patterns + 1)``
        float64 over rows ``[r0, r1)`` (``x``, ``rev``: those rows)."""
        scales = self._scales(r0, r1)
        cl = self.classes
        if cl is not None:  # per class and item, then per pattern (the factorised form's sums)
            m = cl.m
            xv = x.view(-1, m)
            parts = [xv * rev.view(-1, m)]
            parts += [xv if s is None else xv * s.view(-1, m) for s in scales]
            uc = cl.cls[r0 // m : r1 // m]
            return cl.sums(parts, uc, self.num_patterns + 1, x.dtype)
        pid = self.pid[r0:r1]
        x64 = x.double()
        # index_add_, not bincount: bincount's weighted CPU path is several times slower
        out = torch.zeros(1 + len(scales), self.num_patterns + 1, dtype=torch.float64)
        out[0].index_add_(0, pid, x64 * rev)
        for g, s in enumerate(scales):
            out[1 + g].index_add_(0, pid, x64 if s is None else x64 * s)
        return out

    def usage(self, hist: torch.Tensor, sigma: torch.Tensor | None = None) -> torch.Tensor:
        """``sum_g P_g^T (sigma * hist_g)``, float64 ``(K,)``."""
        out = torch.zeros(self.patterns[0].shape[1], dtype=torch.float64)
        for g, p in enumerate(self.patterns):
            h = hist[1 + g] if sigma is None else hist[1 + g] * sigma
            out += p.T @ h
        return out

    def sigma(self, inv64: torch.Tensor) -> torch.Tensor:
        """Per pattern, the least ``inv`` over the resources it consumes (1 if none)."""
        out = torch.ones(self.num_patterns + 1, dtype=torch.float64)
        for p in self.patterns:
            cap = torch.where(p != 0, inv64[None, :], 1.0).amin(1).clamp_max(1.0)
            torch.minimum(out, cap, out=out)
        return out

    def moments(
        self, p: torch.Tensor, keep: torch.Tensor, r0: int, floor: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Over the kept users ``keep`` (ascending, numbered from row ``r0``, ``m`` rows each)
        with choice ``p`` (``(kept, m)``, their rows): per pair of groups ``(x, y)`` the
        per-pattern sums ``p * scale_x * scale_y`` (``(pairs, patterns + 1)``, for
        :meth:`second_moment`) and per user ``mu = sum_j p v`` (``(kept, K)``), leaving out
        rows of probability ``floor`` or below. With user classes both are dense products, as
        the factorised form's metric; else gathers of the rows taken.

        General rows are the zero pattern's: they add nothing. ``mu`` is in the compute dtype
        (the scales'), as the factorised form's metric."""
        dt = self.scales[0].dtype  # the metric's products in the compute dtype, as factorised
        bins = self.num_patterns + 1
        cl = self.classes
        if cl is not None:
            m = cl.m
            u_at = keep + r0 // m
            uk = cl.cls.index_select(0, u_at)
            sk = [
                None if u else s.view(-1, m).index_select(0, u_at)
                for s, u in zip(self.scales, self.unit)
            ]
            pk = p.to(dt).masked_fill(p <= floor, 0)  # the per-row path's floor
            ps = [pk if s is None else pk * s for s in sk]
            parts = []
            for x in range(len(sk)):
                for sy in sk[x:]:
                    parts.append(ps[x] if sy is None else ps[x] * sy)
            return cl.sums(parts, uk, bins, dt), cl.means(ps, uk, self.patterns)
        return self._row_moments(p, keep, r0, floor)

    def _row_moments(
        self, p: torch.Tensor, keep: torch.Tensor, r0: int, floor: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from scipy.sparse import csr_matrix

        kept, m = int(p.shape[0]), int(p.shape[1])
        bins = self.num_patterns + 1
        take = p > floor
        sel = take.view(-1).nonzero().squeeze(1)
        user = torch.div(sel, m, rounding_mode="floor")
        rows = keep.mul(m).add_(r0).index_select(0, user).add_(sel.remainder(m))
        pid = self.pid.index_select(0, rows)
        dt = self.scales[0].dtype
        pc = p.view(-1).index_select(0, sel).to(dt)
        scales = [None if u else s.index_select(0, rows) for s, u in zip(self.scales, self.unit)]
        mu = torch.zeros(kept, int(self.patterns[0].shape[1]), dtype=dt)
        if bins <= m:  # few patterns: per user and pattern sums (dense), then one product
            at = user.mul_(bins).add_(pid)
        else:  # a CSR matrix (kept users, patterns) over the rows taken (duplicates add up)
            indptr = torch.zeros(kept + 1, dtype=torch.long)
            torch.cumsum(take.sum(1), 0, out=indptr[1:])
            ptr_np, pid_np = indptr.numpy(), pid.numpy()
        g_num = len(scales)
        sums = torch.zeros(g_num * (g_num + 1) // 2, bins, dtype=torch.float64)
        i = 0
        for x, (px, sx) in enumerate(zip(self.patterns, scales)):
            ps = pc if sx is None else pc * sx
            px = px.to(dt)
            if bins <= m:
                a = torch.zeros(kept * bins, dtype=dt).index_add_(0, at, ps)
                mu += a.view(kept, bins) @ px
            else:
                a = csr_matrix((ps.numpy(), pid_np, ptr_np), shape=(kept, bins))
                mu += torch.from_numpy(a @ px.numpy())
            ps64 = ps.double()
            for sy in scales[x:]:
                sums[i].index_add_(0, pid, ps64 if sy is None else ps64 * sy)
                i += 1
        return sums, mu

    def second_moment(self, sums: torch.Tensor) -> torch.Tensor:
        """``sum p v v^T`` (K, K) from :meth:`moments`' per-pattern sums (added up)."""
        k_num = int(self.patterns[0].shape[1])
        t1 = torch.zeros(k_num, k_num, dtype=torch.float64)
        i = 0
        for x, px in enumerate(self.patterns):
            for py in self.patterns[x:]:
                c = px.T @ (sums[i][:, None] * py)
                t1 += c if py is px else c + c.T
                i += 1
        return t1


def find_patterns(
    rowptr: torch.Tensor,
    row_of: torch.Tensor,
    kk: torch.Tensor,
    vals: torch.Tensor,
    k_num: int,
    m: int = 0,
) -> RowPatterns | None:
    """The rows that compress, or ``None`` when too few do (see the module docstring).

    ``rowptr`` (rows + 1) points into the entries, sorted by row: ``row_of`` (their row),
    ``kk`` (resource) and ``vals`` (value, > 0). CPU tensors. Ratios are computed and checked
    in the dtype of ``vals``.
    """
    rows = rowptr.numel() - 1
    if rows == 0 or kk.numel() == 0:
        return None
    # counts: resources whose every entry has one value
    lo = torch.full((k_num,), float("inf"), dtype=vals.dtype).scatter_reduce(0, kk, vals, "amin")
    hi = torch.zeros(k_num, dtype=vals.dtype).scatter_reduce(0, kk, vals, "amax")
    const = lo == hi
    cnt = rowptr[1:] - rowptr[:-1]
    # a row's scale in the other resources' group: the sum of its values there (float64, so
    # that rows of one pattern get the same ratios to within the data's rounding); counts'
    # scale is 1 (their values are the pattern's)
    any_const, all_const = bool(const.any()), bool(const.all())
    c_e = const.index_select(0, kk) if any_const and not all_const else None
    scale = torch.zeros(rows, dtype=torch.float64)
    # (in place where it can: every fresh entry-sized tensor costs its page faults)
    if not all_const:
        v64 = vals.to(torch.float64, copy=True)  # (float64 data: not its own storage)
        if c_e is not None:
            v64.masked_fill_(c_e, 0)
        scale.index_add_(0, row_of, v64)
        del v64
    scale = scale.to(vals.dtype)
    if all_const:
        ratio = vals
    else:
        ratio = scale.index_select(0, row_of)
        if c_e is not None:
            ratio.masked_fill_(c_e, 1)
        torch.div(vals, ratio, out=ratio)
    ids = key_ids(row_keys(ratio, kk, row_of, cnt, k_num))
    if ids is None:
        return None
    pid, counts = ids
    npat = int(counts.numel())
    # a row whose pattern no other row shares stays general (its own pattern would not pay)
    single = counts == 1
    n_single = int(single.sum())
    most = max(64, MAX_PATTERN_SHARE * rows)
    # (rows of their own pattern stay general: past half of the rows, nothing compresses)
    if npat - n_single > most or n_single > rows // 2:
        return None
    if (npat + 1) * k_num > MAX_PATTERN_ENTRIES:
        return None
    # each pattern's values: those of its first row
    rep = torch.full((npat,), rows, dtype=torch.long).scatter_reduce(
        0, pid, torch.arange(rows), "amin"
    )
    lengths = cnt[rep]
    offs = torch.cumsum(lengths, 0) - lengths
    at = torch.repeat_interleave(rowptr[rep] - offs, lengths) + torch.arange(int(lengths.sum()))
    pat = torch.zeros(npat + 1, k_num, dtype=torch.float64)
    pat[pid[row_of[at]], kk[at]] = ratio[at].double()
    tol = 8 * torch.finfo(vals.dtype).eps
    # patterns the hash split (within the tolerance, across a dropped bit) merged: rows of one
    # pattern share one id, and users their classes
    remap = merge_split(pat[:npat], tol / 2) if npat <= most else None
    if remap is not None:
        pid = remap.index_select(0, pid)
        npat = int(remap.max()) + 1
        counts = torch.zeros(npat, dtype=torch.long).index_add_(0, remap, counts)
        single = counts == 1
        firsts = torch.full((npat,), len(remap), dtype=torch.long).scatter_reduce(
            0, remap, torch.arange(len(remap)), "amin"
        )
        pat = torch.cat([pat.index_select(0, firsts), pat[-1:]])
    # every entry checked: the same support (count, and each resource in it) and ratio
    at_e = (pid * k_num).index_select(0, row_of).add_(kk)
    back = pat.view(-1).to(ratio.dtype).index_select(0, at_e)
    del at_e
    bad_e = back.div_(ratio).sub_(1).abs_() > tol
    # a pattern's entries (-1 for a row's own pattern: always general)
    support = (pat[:npat] != 0).sum(1).masked_fill_(single, -1)
    bad = support.index_select(0, pid) != cnt
    if bool(bad_e.any()):
        bad[row_of[bad_e]] = True
    if int(bad.sum()) > rows // 2:
        return None
    patterns, scales, unit = [], [], []
    if not all_const:
        patterns.append(pat if not any_const else pat * ~const)
        scales.append(scale)
        unit.append(False)
    if any_const:
        patterns.append(pat * const)
        scales.append(torch.ones(rows, dtype=vals.dtype))
        unit.append(True)
    if bool(bad.any()):
        pid[bad] = npat
        for s in scales:
            s[bad] = 0
    # the general rows' entries (none: no gather)
    entries = bad[row_of] if bool(bad.any()) else torch.zeros(row_of.numel(), dtype=torch.bool)
    classes = find_classes(pid, m, k_num) if m else None
    return RowPatterns(pid, scales, patterns, bad, entries, unit, classes)
