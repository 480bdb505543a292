"""Comparing a shadow (candidate) version's outputs with the served version's, and latency
histograms that merge across replicas (pure logic: numpy only, no Redis, no torch).

A comparison counts, over the mirrored rows:

* ``agreement``: the share of rows whose label is the same. Labels are the outputs themselves
  when they are integers or booleans, the argmax when a row has several float outputs; a row of
  one float output has no label (regression): only the mean absolute difference is kept.
* ``mad``: the mean absolute difference of float outputs, over the elements of rows where both
  outputs are finite.
* ``nonfinite``: rows where either output has a NaN or an infinity (they count as disagreeing and
  are left out of ``mad``); ``mismatched``: rows the candidate answered in another shape.
* latency p50/p99 of the live forward passes and of the candidate's, from log-spaced buckets;
  ``errors`` (mirrored calls the candidate raised on) and ``dropped`` (mirrored calls not run
  because the bounded queue was full): nothing disappears without a count.

Counters are kept as deltas and flushed as Redis hash increments (:meth:`Comparison.take`);
:func:`summarize` turns the merged hash back into figures, ignoring fields it cannot read.
"""

from __future__ import annotations

import math
import threading
from typing import Any

__all__ = ["BUCKETS", "Comparison", "bucket_of", "quantile_ms", "summarize"]

#: Latency buckets: bucket ``i`` holds latencies up to ``_BASE_MS * _RATIO ** i`` (the last one
#: everything above): 0.05 ms to ~110 s in steps of 20%.
BUCKETS = 80
_BASE_MS = 0.05
_RATIO = 1.2
_INT_FIELDS = (
    "calls",
    "rows",
    "agree",
    "labelled",
    "abs_n",
    "nonfinite",
    "mismatched",
    "errors",
    "error_rows",
    "dropped",
    "dropped_rows",
)


def bucket_of(seconds: float) -> int:
    """The latency bucket of a duration (NaN or negative: the first; huge: the last)."""
    ms = seconds * 1000.0
    if not ms > _BASE_MS:  # also NaN
        return 0
    if math.isinf(ms):
        return BUCKETS - 1
    return min(BUCKETS - 1, math.ceil(math.log(ms / _BASE_MS) / math.log(_RATIO)))


def quantile_ms(counts: dict[int, int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of bucketed latencies, as its bucket's upper bound in ms
    (None when there are none)."""
    total = sum(c for c in counts.values() if c > 0)
    if total <= 0:
        return None
    rank = max(1.0, q * total)
    seen = 0
    for i in sorted(counts):
        if counts[i] > 0:
            seen += counts[i]
            if seen >= rank:
                return round(_BASE_MS * _RATIO**i, 3)
    return round(_BASE_MS * _RATIO ** max(counts), 3)  # pragma: no cover - rank <= total


class Comparison:
    """Counters of one shadow experiment in one replica (thread-safe; see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ints: dict[str, int] = dict.fromkeys(_INT_FIELDS, 0)
        self._abs_sum = 0.0
        self._live: dict[int, int] = {}
        self._cand: dict[int, int] = {}

    def compare(self, live: Any, candidate: Any) -> None:
        """Count one mirrored call: the served outputs and the candidate's, rows first."""
        import numpy as np

        live = np.asarray(live)
        cand = np.asarray(candidate)
        n = int(live.shape[0]) if live.ndim else 1
        counts = dict.fromkeys(_INT_FIELDS, 0)
        counts["calls"], counts["rows"] = 1, n
        abs_sum = 0.0
        if n == 0:
            pass
        elif cand.shape != live.shape:
            counts["mismatched"] = n
            counts["labelled"] = n  # a row answered in another shape disagrees
        else:
            lr, cr = live.reshape(n, -1), cand.reshape(n, -1)
            if lr.dtype.kind in "biu" and cr.dtype.kind in "biu":
                counts["labelled"] = n
                counts["agree"] = int((lr == cr).all(axis=1).sum())
            else:
                lf, cf = lr.astype(np.float64), cr.astype(np.float64)
                finite = np.isfinite(lf).all(axis=1) & np.isfinite(cf).all(axis=1)
                counts["nonfinite"] = int(n - finite.sum())
                if finite.any():
                    diff = np.abs(lf[finite] - cf[finite])
                    abs_sum = float(diff.sum())
                    counts["abs_n"] = int(diff.size)
                if lr.shape[1] > 1:
                    counts["labelled"] = n
                    same = lf[finite].argmax(axis=1) == cf[finite].argmax(axis=1)
                    counts["agree"] = int(same.sum())
        with self._lock:
            for k, v in counts.items():
                self._ints[k] += v
            self._abs_sum += abs_sum

    def error(self, rows: int) -> None:
        """The candidate raised on a mirrored call of ``rows`` rows."""
        with self._lock:
            self._ints["errors"] += 1
            self._ints["error_rows"] += rows

    def dropped(self, rows: int) -> None:
        """A mirrored call of ``rows`` rows was not run (the in-flight bound was reached)."""
        with self._lock:
            self._ints["dropped"] += 1
            self._ints["dropped_rows"] += rows

    def latency(self, live_s: float | None, candidate_s: float | None) -> None:
        """One forward pass's duration, of the live version or of the candidate."""
        with self._lock:
            if live_s is not None:
                b = bucket_of(live_s)
                self._live[b] = self._live.get(b, 0) + 1
            if candidate_s is not None:
                b = bucket_of(candidate_s)
                self._cand[b] = self._cand.get(b, 0) + 1

    def take(self) -> tuple[dict[str, int], float]:
        """The counters since the last take, as hash increments (``live:<i>``/``cand:<i>`` for
        latency buckets) and the absolute-difference sum; then zero them."""
        with self._lock:
            ints = {k: v for k, v in self._ints.items() if v}
            ints.update({f"live:{i}": c for i, c in self._live.items()})
            ints.update({f"cand:{i}": c for i, c in self._cand.items()})
            abs_sum = self._abs_sum
            self._ints = dict.fromkeys(_INT_FIELDS, 0)
            self._abs_sum = 0.0
            self._live, self._cand = {}, {}
        return ints, abs_sum

    def give_back(self, ints: dict[str, int], abs_sum: float) -> None:
        """Add back counters whose flush failed (they go with the next one)."""
        with self._lock:
            for k, v in ints.items():
                if k.startswith(("live:", "cand:")):
                    hist = self._live if k.startswith("live:") else self._cand
                    i = int(k.split(":", 1)[1])
                    hist[i] = hist.get(i, 0) + v
                else:
                    self._ints[k] = self._ints.get(k, 0) + v
            self._abs_sum += abs_sum


def _num(raw: Any) -> float | None:
    try:
        v = float(raw.decode() if isinstance(raw, bytes) else raw)
    except (TypeError, ValueError, AttributeError):
        return None
    return v if math.isfinite(v) else None


def summarize(fields: dict[Any, Any]) -> dict[str, Any]:
    """Figures of a comparison hash (as Redis returns it, bytes or str): ``calls``, ``rows``,
    ``agreement`` and ``mad`` (None when nothing could be compared), ``nonfinite``,
    ``mismatched``, ``errors``, ``error_rows``, ``dropped``, ``dropped_rows``, ``live_p50_ms``,
    ``live_p99_ms``, ``candidate_p50_ms``, ``candidate_p99_ms``, and the hash's ``version``,
    ``share`` and ``started_at`` when set. Unreadable values count as absent."""
    text = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in fields.items()}
    ints = {k: int(_num(text.get(k)) or 0) for k in _INT_FIELDS}
    hists: dict[str, dict[int, int]] = {"live": {}, "cand": {}}
    for k, v in text.items():
        kind, _, idx = k.partition(":")
        if kind in hists and idx.isdigit() and 0 <= int(idx) < BUCKETS:
            c = _num(v)
            if c is not None and c > 0:
                hists[kind][int(idx)] = int(c)
    abs_sum = _num(text.get("abs_sum"))
    out: dict[str, Any] = dict(ints)
    out["agreement"] = ints["agree"] / ints["labelled"] if ints["labelled"] > 0 else None
    out["mad"] = abs_sum / ints["abs_n"] if ints["abs_n"] > 0 and abs_sum is not None else None
    for name, kind in (("live", "live"), ("candidate", "cand")):
        out[f"{name}_p50_ms"] = quantile_ms(hists[kind], 0.5)
        out[f"{name}_p99_ms"] = quantile_ms(hists[kind], 0.99)
    for k in ("version", "share", "started_at", "stopped_at"):
        v = _num(text.get(k))
        if v is not None:
            out[k] = int(v) if k == "version" else v
    return out
