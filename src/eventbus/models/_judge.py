"""Judging a model version on its live figures against the previous version's (pure logic).

A replica counts, per version, the rows each forward pass ran, the rows of passes that raised,
and each pass's duration, in one-second buckets (:class:`VersionWindow`). :func:`judge` compares
a version's last ``window_s`` with the previous version's and gives the reason to roll it back,
or None:

* its error rate (failed rows / rows) exceeds the previous version's by more than
  ``error_rate_margin`` (an absolute difference: 0.05 is five points);
* its p99 pass latency exceeds ``p99_ratio`` times the previous version's and ``p99_min_ms``.

Nothing is judged on fewer than ``min_rows`` rows of the version (an empty or thin window
proves nothing); a previous version with fewer rows counts as error free, and its p99 as
unknown (the latency rule is then skipped), and p99s of fewer than ``MIN_PASSES`` passes are
not compared.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

from eventbus.models._compare import bucket_of, quantile_ms

__all__ = ["MIN_PASSES", "RollbackPolicy", "VersionWindow", "WindowFigures", "judge"]

_KEEP_S = 3600  # buckets older than this are dropped whatever the window
#: Passes each version needs in the window before its p99 is judged (a p99 of fewer is noise).
MIN_PASSES = 50


@dataclass(frozen=True)
class RollbackPolicy:
    """When a version serving a split (or all traffic, during ``probation_s`` after it took
    over) is rolled back; see the module docstring."""

    enabled: bool = True
    window_s: float = 60.0
    min_rows: int = 20
    error_rate_margin: float = 0.05
    p99_ratio: float | None = 3.0
    p99_min_ms: float = 100.0
    probation_s: float = 600.0

    @classmethod
    def from_options(cls, raw: Any) -> RollbackPolicy:
        """The policy of a model's ``serving.rollback`` settings (a dict; None: defaults)."""
        if not isinstance(raw, dict):
            return cls()
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)


@dataclass(frozen=True)
class WindowFigures:
    """A version's figures over a window."""

    rows: int = 0
    error_rows: int = 0
    passes: int = 0
    hist: dict[int, int] = field(default_factory=dict)

    @property
    def error_rate(self) -> float:
        return self.error_rows / self.rows if self.rows > 0 else 0.0

    @property
    def p99_ms(self) -> float | None:
        return quantile_ms(self.hist, 0.99)

    def as_dict(self) -> dict[str, Any]:
        """Plain figures for a record: rows, error_rows, error_rate, passes, p50_ms, p99_ms."""
        return {
            "rows": self.rows,
            "error_rows": self.error_rows,
            "error_rate": round(self.error_rate, 6),
            "passes": self.passes,
            "p50_ms": quantile_ms(self.hist, 0.5),
            "p99_ms": self.p99_ms,
        }


class VersionWindow:
    """One version's live figures in one-second buckets (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # second -> [rows, error rows, passes, {latency bucket: passes}]
        self._buckets: dict[int, list[Any]] = {}

    def add(self, rows: int, error_rows: int, seconds: float, now: float) -> None:
        """Count one forward pass (``now``: a monotonic clock, in seconds)."""
        if rows < 0 or error_rows < 0 or not math.isfinite(now):
            return
        sec = int(now)
        b = bucket_of(seconds)
        with self._lock:
            slot = self._buckets.get(sec)
            if slot is None:
                slot = self._buckets[sec] = [0, 0, 0, {}]
                for old in [s for s in self._buckets if s < sec - _KEEP_S]:
                    del self._buckets[old]
            slot[0] += rows
            slot[1] += min(error_rows, rows)
            slot[2] += 1
            slot[3][b] = slot[3].get(b, 0) + 1

    def figures(self, now: float, window_s: float) -> WindowFigures:
        """The figures of the last ``window_s`` seconds."""
        since = now - max(0.0, window_s) if math.isfinite(window_s) else -math.inf
        rows = errors = passes = 0
        hist: dict[int, int] = {}
        with self._lock:
            slots = [v for s, v in self._buckets.items() if s + 1 > since]
            for r, e, p, h in slots:
                rows, errors, passes = rows + r, errors + e, passes + p
                for i, c in h.items():
                    hist[i] = hist.get(i, 0) + c
        return WindowFigures(rows, errors, passes, hist)

    def clear(self) -> None:
        with self._lock:
            self._buckets.clear()


def judge(
    candidate: WindowFigures, previous: WindowFigures | None, policy: RollbackPolicy
) -> str | None:
    """Why ``candidate`` must be rolled back against ``previous`` (None: it stays)."""
    if not policy.enabled or candidate.rows < max(1, policy.min_rows):
        return None
    known = previous is not None and previous.rows >= max(1, policy.min_rows)
    base_rate = previous.error_rate if known and previous is not None else 0.0
    rate = candidate.error_rate
    if rate > base_rate + policy.error_rate_margin:
        return (
            f"error rate {rate:.1%} ({candidate.error_rows} of {candidate.rows} rows) over the "
            f"last {policy.window_s:g} s exceeds the previous version's "
            f"{base_rate:.1%}{'' if known else ' (too few rows: taken as 0)'} by more than "
            f"{policy.error_rate_margin:.1%}"
        )
    if policy.p99_ratio is None or not known or previous is None:
        return None
    p99, base = candidate.p99_ms, previous.p99_ms
    if p99 is None or base is None or candidate.passes < MIN_PASSES or previous.passes < MIN_PASSES:
        return None
    limit = max(base * policy.p99_ratio, policy.p99_min_ms)
    if p99 > limit:
        return (
            f"p99 {p99:g} ms over the last {policy.window_s:g} s exceeds {limit:g} ms "
            f"({policy.p99_ratio:g} x the previous version's {base:g} ms, at least "
            f"{policy.p99_min_ms:g} ms)"
        )
    return None
