"""A factorised consumption as a sparse COO ``(n, m, K)`` tensor, without a pass per resource.

Entry ``(i, j, k)`` is nonzero when resource ``k`` applies to user ``i``'s segment and to item
``j``: the resources of each (segment, item) cell are listed once (``cell_rows``), then every
user's rows repeat their segment's lists. The entries come out sorted by ``(i, j, k)`` with no
duplicates (a coalesced tensor, no sort), their values ``W_k[i, j] * (item_cost[k, j] *
segment_mask[k, g])`` in the consumption's dtype, computed in the order the per-row form
(``FactorisedConsumption.row``) computes them, so both give the same bits. Users go in chunks of
about ``CHUNK_ENTRIES`` entries: the temporaries stay bounded whatever ``K``.
"""

from __future__ import annotations

import torch

from eventbus.solver._factorised import FactorisedConsumption

__all__ = ["factorised_to_sparse"]

CHUNK_ENTRIES = 1 << 23


def cell_rows(
    cons: FactorisedConsumption, limit: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Per (segment, item) cell ``g * m + j``, its resources (CPU tensors): ``ptr (G*m + 1)``
    into the entries, and per entry its ``cell``, resource ``k`` (ascending within a cell) and
    weight group (index into ``cons.groups``). ``None`` past ``limit`` entries."""
    ic, sm = cons.item_cost.cpu(), cons.segment_mask.cpu()
    g_num, m = sm.shape[1], ic.shape[1]
    # (k, g) pairs and (k, j) pairs, joined on k: the (g, j, k) entries of every cell
    kg = (sm.T > 0).nonzero()  # (g, k) sorted by g then k
    kj = (ic > 0).nonzero()  # (k, j) sorted by k then j
    per_k = torch.bincount(kj[:, 0], minlength=ic.shape[0])
    reps = per_k.index_select(0, kg[:, 1])
    total = int(reps.sum())
    if limit is not None and total > limit:
        return None
    start = torch.cumsum(per_k, 0) - per_k
    g_e = torch.repeat_interleave(kg[:, 0], reps, output_size=total)
    k_e = torch.repeat_interleave(kg[:, 1], reps, output_size=total)
    at = start.index_select(0, kg[:, 1]) - (torch.cumsum(reps, 0) - reps)
    first = torch.repeat_interleave(at, reps, output_size=total)
    j_e = kj[:, 1].index_select(0, first + torch.arange(total))
    cell = g_e * m + j_e
    order = torch.argsort(cell * ic.shape[0] + k_e)  # by cell, then k
    cell, k_e = cell[order], k_e[order]
    ptr = torch.zeros(g_num * m + 1, dtype=torch.long)
    torch.cumsum(torch.bincount(cell, minlength=g_num * m), 0, out=ptr[1:])
    group = torch.zeros(ic.shape[0], dtype=torch.long)
    for gi, (_, rows) in enumerate(cons.groups):
        group[rows.cpu()] = gi
    return ptr, cell, k_e, group.index_select(0, k_e)


def factorised_to_sparse(cons: FactorisedConsumption, n: int, m: int) -> torch.Tensor:
    """``cons`` as a coalesced sparse COO ``(n, m, K)`` tensor on the consumption's device."""
    dev = cons.item_cost.device
    found = cell_rows(cons)
    assert found is not None
    ptr, cell, ks, grp = found
    ic, sm = cons.item_cost.cpu(), cons.segment_mask.cpu()
    coef = ic[ks, cell.remainder(m)] * sm[ks, torch.div(cell, m, rounding_mode="floor")]
    count = ptr[1:] - ptr[:-1]  # resources per (segment, item) cell
    seg = cons.segment.cpu().long()
    weights = [cons.weight_of(name) for name, _ in cons.groups]
    weights = [None if w is None else w.cpu() for w in weights]
    parts_i, parts_v = [], []
    per_user = count.view(-1, m).sum(1).index_select(0, seg) if n else seg
    users = max(1, CHUNK_ENTRIES // max(1, int(per_user.max()) if n else 1))
    for a in range(0, n, users):
        b = min(a + users, n)
        cells = (seg[a:b, None] * m + torch.arange(m)).reshape(-1)  # (users * m), (i, j) order
        reps = count.index_select(0, cells)
        total = int(reps.sum())
        row = torch.repeat_interleave(torch.arange(cells.numel()), reps, output_size=total)
        offs = torch.cumsum(reps, 0) - reps
        at = ptr.index_select(0, cells).sub_(offs)
        e = torch.repeat_interleave(at, reps, output_size=total).add_(torch.arange(total))
        k_e, vals = ks.index_select(0, e), coef.index_select(0, e)
        g_e = grp.index_select(0, e)
        for gi, w in enumerate(weights):
            if w is None:
                continue
            sel = (g_e == gi).nonzero().squeeze(1)
            wv = w[a:b].reshape(-1).index_select(0, row.index_select(0, sel))
            vals[sel] = wv * vals[sel]
        keep = (vals != 0).nonzero().squeeze(1)
        row, k_e, vals = row[keep], k_e[keep], vals[keep]
        user = torch.div(row, m, rounding_mode="floor").add_(a)
        parts_i.append(torch.stack([user, row.remainder(m), k_e]))
        parts_v.append(vals)
    k_num = cons.num_resources
    if parts_i:
        idx, val = torch.cat(parts_i, 1), torch.cat(parts_v)
    else:
        idx = torch.zeros(3, 0, dtype=torch.long)
        val = torch.zeros(0, dtype=cons.item_cost.dtype)
    out = torch.sparse_coo_tensor(
        idx, val, (n, m, k_num), is_coalesced=True, check_invariants=False
    )
    return out.to(dev) if dev.type != "cpu" else out
