"""User classes: blocks of compressed rows whose users repeat a few rows of pattern ids.

When a problem's rows come from per-(segment, item) costs (budgets on user segments and item
subsets, as ``FactorisedConsumption.to_sparse()`` makes them), user ``i``'s row of pattern ids
``pid[i, :]`` (one per item) is one of few: its segment's. Those blocks keep each user's class
and each class's ``m`` pattern ids (``table``, ``(C, m)``), and a pass over them is the
factorised form's: the reduced cost subtracts ``scale * price_table[class]`` (a row gather), the
per-pattern sums are ``onehot(class) @ (p * scale)`` (one ``(C, users) @ (users, m)`` product)
and the Newton metric's per-user means are one ``(users, m) @ (m, K)`` product per class,
instead of a gather and a scatter per (user, item) row.

Classes are found per reduction block (hash of each user's row of ids, then every id checked);
a block with more than ``MAX_CLASSES`` classes, or a mismatch, keeps the per-row path.
"""

from __future__ import annotations

import torch

__all__ = ["MAX_CLASSES", "MAX_CLASS_ENTRIES", "UserClasses", "find_classes"]

MAX_CLASSES = 16  # more classes than this: the per-row gathers are cheaper than the products
MAX_CLASS_ENTRIES = 1 << 22  # nor when classes x items x K (the metric's tables) exceed this
_M1, _M2 = 0x9E3779B97F4A7C15 - (1 << 64), 0x632BE59BD9B4E019


class UserClasses:
    """Each user's class (``cls``, users of the block) and each class's pattern ids (``table``).

    Args:
        cls: ``(users,)`` long, the class of each user of the block.
        table: ``(C, m)`` long, each class's row of pattern ids.
    """

    def __init__(self, cls: torch.Tensor, table: torch.Tensor) -> None:
        self.cls = cls
        self.table = table
        self.num, self.m = int(table.shape[0]), int(table.shape[1])
        self.flat = table.reshape(-1)
        self._ptab: list[torch.Tensor] | None = None

    def _onehot(self, uc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.nn.functional.one_hot(uc, self.num).T.to(dtype)

    def subtract_prices(
        self,
        r: torch.Tensor,
        prices: list[torch.Tensor],
        scales: list[torch.Tensor | None],
        u0: int,
    ) -> None:
        """``r -= sum_g scale_g * prices_g[table[cls]]`` over users ``[u0, u0 + len(r))``
        (``r``: ``(users, m)``; a group's scale ``None``: 1)."""
        uc = self.cls[u0 : u0 + r.shape[0]]
        for s, pr in zip(scales, prices):
            t = pr.index_select(0, self.flat).view(self.num, self.m).index_select(0, uc)
            if s is None:
                r.sub_(t)
            else:
                r.addcmul_(t, s, value=-1)

    def sums(
        self, parts: list[torch.Tensor], uc: torch.Tensor, bins: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """Per pattern (``bins``), ``sum`` of each ``(users, m)`` part over the users of
        classes ``uc``: ``(len(parts), bins)`` float64 (products in ``dtype``, as the factorised
        form's per-segment sums)."""
        onehot = self._onehot(uc, dtype)
        out = torch.zeros(len(parts), bins, dtype=torch.float64)
        for o, w in zip(out, parts):
            o.index_add_(0, self.flat, (onehot @ w).reshape(-1).double())
        return out

    def means(
        self, ps: list[torch.Tensor], uc: torch.Tensor, patterns: list[torch.Tensor]
    ) -> torch.Tensor:
        """Per user, ``mu = sum_g sum_j ps_g[u, j] * patterns_g[table[cls[u], j]]``:
        ``(users, K)`` in the dtype of ``ps``, one product per class and group."""
        dt = ps[0].dtype
        if self._ptab is None or self._ptab[0].dtype != dt:
            # (C, m, K) per group: each class's rows of patterns
            self._ptab = [
                p.to(dt).index_select(0, self.flat).view(self.num, self.m, -1) for p in patterns
            ]
        k_num = int(patterns[0].shape[1])
        mu = torch.zeros(int(uc.shape[0]), k_num, dtype=dt)
        for c in range(self.num):
            sel = (uc == c).nonzero().squeeze(1)
            if sel.numel() == 0:
                continue
            acc = torch.zeros(sel.numel(), k_num, dtype=dt)
            for p_g, tab in zip(ps, self._ptab):
                acc.addmm_(p_g.index_select(0, sel), tab[c])
            mu.index_copy_(0, sel, acc)
        return mu


def find_classes(pid: torch.Tensor, m: int, k_num: int) -> UserClasses | None:
    """The classes of a block's users from its rows' pattern ids ``pid`` (``users * m``), or
    ``None`` when there are too many (or a hash collision: every id is checked)."""
    rows = int(pid.numel())
    if m < 1 or rows == 0 or rows % m:
        return None
    users = rows // m
    pu = pid.view(users, m)
    # a linear hash of the row (wrapping int64): a collision only fails the check below
    mult = torch.arange(1, m + 1, dtype=torch.long).mul_(_M1)
    mult = (mult ^ (mult >> 31)).mul_(_M2)
    key = (pu * mult).sum(1)
    uniq, cls = torch.unique(key, return_inverse=True)
    num = int(uniq.numel())
    if num > MAX_CLASSES or num * m * k_num > MAX_CLASS_ENTRIES:
        return None
    rep = torch.full((num,), users, dtype=torch.long).scatter_reduce(
        0, cls, torch.arange(users), "amin"
    )
    table = pu.index_select(0, rep)
    if not torch.equal(table.index_select(0, cls), pu):
        return None
    return UserClasses(cls, table)


_COARSE_BITS = 13  # float32 ulps per cell of the coarse pattern key (2 ** 13)


def _close_to_group_min(pats: torch.Tensor, offset: int, tol: float) -> torch.Tensor:
    """Each pattern's id after one round: the least id of its coarse cell (float32 bits of its
    values, shifted by ``offset`` ulps, ``_COARSE_BITS`` dropped) when its values are that
    pattern's to within ``tol`` (relative) on the same support, else its own."""
    npat, k_num = int(pats.shape[0]), int(pats.shape[1])
    ids = torch.arange(npat)
    cells = (pats.float().view(torch.int32).long() + offset) >> _COARSE_BITS
    mult = torch.arange(1, k_num + 1, dtype=torch.long).mul_(_M1)
    mult = (mult ^ (mult >> 31)).mul_(_M2)
    _, inv = torch.unique((cells * mult).sum(1), return_inverse=True)
    least = torch.full((npat,), npat, dtype=torch.long).scatter_reduce(0, inv, ids, "amin")
    cand = least.index_select(0, inv)
    other = pats.index_select(0, cand)
    same = ((pats != 0) == (other != 0)).all(1)
    same &= ((pats - other).abs() <= tol * pats.abs()).all(1)
    return torch.where(same, cand, ids)


def merge_split(pats: torch.Tensor, tol: float) -> torch.Tensor | None:
    """Old id -> new id (dense) for patterns ``pats`` (``(npat, K)``) that the row hash split
    (values within ``tol`` of each other on either side of a dropped bit), or ``None`` when
    none merge. Two rounds on coarse cells offset by half a cell: a pair within the tolerance
    shares a cell in at least one of them unless two of its values straddle."""
    npat = int(pats.shape[0])
    if npat < 2:
        return None
    first = _close_to_group_min(pats, 0, tol)
    reps = (first == torch.arange(npat)).nonzero().squeeze(1)
    second = reps.index_select(0, _close_to_group_min(pats.index_select(0, reps), 1 << 12, tol))
    to_rep = torch.arange(npat)
    to_rep[reps] = second
    final = to_rep.index_select(0, first)
    used = torch.zeros(npat, dtype=torch.bool)
    used[final] = True
    if bool(used.all()):
        return None
    return (torch.cumsum(used, 0) - 1).index_select(0, final)
