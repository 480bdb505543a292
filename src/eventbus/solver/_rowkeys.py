"""Row keys to pattern ids without sorting or hashing every key: a sample's distinct keys go in
a direct-address table, every row looks its key up there (two gathers), and only the rows it
misses (keys the sample did not see, or that lost a table slot) are made unique.

A pass over a compressing block's rows is then a few element-wise passes instead of
``torch.unique`` over all of them; when nearly every sampled row has a key of its own
(``SKIP_SHARE``), no pattern can be shared by enough rows to pay and the search stops there.
"""

from __future__ import annotations

import torch

__all__ = ["SAMPLE_ROWS", "SKIP_SHARE", "key_ids", "row_keys"]

SAMPLE_ROWS = 1 << 16  # rows sampled (evenly) for the table; fewer rows: all of them, sorted
SKIP_SHARE = 0.9  # more distinct keys than this share of the sample: compression cannot pay
_HASH_DROP_BITS = 4  # float32 bits of the ratios left out of the hash (rounding noise)
_M2, _M3 = 0x2BE59BD9 - (1 << 31), 0x4F6CDD1D  # odd int32 multipliers (wrapping products)
_SAMPLE_PRIME = 1_000_000_007
_MAX_BITS = 21  # the table: at most 2M slots (16 MB)
_SLOT_MUL = 0x61C88647  # odd int32 multiplier (Fibonacci hashing: the product's top bits)
_SALT_MUL = 0x9E3779B97F4A7C15 - (1 << 64)


def _ratio_bits(ratio: torch.Tensor) -> torch.Tensor:
    """The hash of each ratio's bits, int32: the last ``_HASH_DROP_BITS`` of float32's mantissa
    (``52 - 23 + _HASH_DROP_BITS`` of float64's) left out, so that rounding noise in the data
    mostly keeps rows of one pattern together (rows split across a boundary only make two
    patterns of the same values)."""
    if ratio.dtype == torch.float32:
        bits = ratio.view(torch.int32) >> _HASH_DROP_BITS
    else:
        bits = (ratio.double().view(torch.long) >> (29 + _HASH_DROP_BITS)).to(torch.int32)
    return bits.mul_(_M3)


def row_keys(
    ratio: torch.Tensor, kk: torch.Tensor, row_of: torch.Tensor, cnt: torch.Tensor, k_num: int
) -> torch.Tensor:
    """Each row's key (int32): the wrapping sum of its entries' (resource, ratio) hashes and
    its entry count, not mixed further (a collision only puts two patterns under one id: the
    entry-by-entry check makes those rows general)."""
    h = _ratio_bits(ratio).bitwise_xor_(_salt(k_num).index_select(0, kk))
    key = torch.zeros(int(cnt.numel()), dtype=torch.int32).index_add_(0, row_of, h)
    return key.add_(cnt.to(torch.int32).mul_(_M2))


def _salt(k_num: int) -> torch.Tensor:
    """Per resource, a well-mixed int32 that its entries' hashes are xor-ed with."""
    h = torch.arange(1, k_num + 1, dtype=torch.long).mul_(_SALT_MUL)
    h = h ^ (h >> 31)
    h = h.mul_(0x632BE59BD9B4E019)
    return (h ^ (h >> 29)).to(torch.int32)


def _slots(key: torch.Tensor, bits: int) -> torch.Tensor:
    """Each key's slot in a table of ``2 ** bits``: the top bits of ``key * _SLOT_MUL``."""
    return ((key * _SLOT_MUL) >> (32 - bits)).bitwise_and_((1 << bits) - 1)


def key_ids(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Dense ids of the distinct values of ``key`` (int32, one per row) and each id's row count,
    or ``None`` when a sample of the rows shows nearly every key distinct."""
    rows = int(key.numel())
    if rows <= 2 * SAMPLE_ROWS:
        uniq, pid = torch.unique(key, return_inverse=True)
        return pid, torch.bincount(pid, minlength=int(uniq.numel()))
    # distinct rows ``i * P mod rows`` (``P`` a prime above any block's rows: coprime to it and
    # to the items per user, so a plain stride's aliasing with the items cannot happen)
    at = torch.arange(SAMPLE_ROWS, dtype=torch.long).mul_(_SAMPLE_PRIME).remainder_(rows)
    sample = torch.unique(key.index_select(0, at))
    nu = int(sample.numel())
    if nu > SKIP_SHARE * SAMPLE_ROWS:
        return None
    # ~64 slots per key: few sample keys collide (the birthday bound), and a loser's rows
    # only go to the misses' unique
    bits = min(_MAX_BITS, max(12, (64 * nu - 1).bit_length()))
    table = torch.full((1 << bits,), -1, dtype=torch.long)
    table[_slots(sample, bits)] = torch.arange(nu)  # colliding keys: one of them keeps the slot
    pid = table.index_select(0, _slots(key, bits))
    # an empty slot (-1) reads sample[0], whose own slot is not empty: never equal to the key
    miss = sample.index_select(0, pid.clamp_min(0)) != key
    if bool(miss.any()):
        at = miss.nonzero().squeeze(1)
        uniq, inv = torch.unique(key.index_select(0, at), return_inverse=True)
        pid.index_copy_(0, at, inv.add_(nu))
        nu += int(uniq.numel())
    counts = torch.bincount(pid, minlength=nu)
    used = counts > 0
    if not bool(used.all()):  # sample keys that lost their slot have no rows: renumber
        pid = (torch.cumsum(used, 0) - 1).index_select(0, pid)
        counts = counts[used]
    return pid, counts
