"""Counters and histograms kept by replicas and the gateway, and how they are merged.

Everything here is plain Python with no metrics library: the replicas update these once per
batch (never per event), publish a JSON snapshot to Redis every second with their source
counters, and the gateway merges the snapshots of all live replicas into Prometheus metrics
(:mod:`eventbus.observability._prometheus`) and the dashboard's JSON.

Histograms have fixed bucket bounds so that replicas' histograms add up bucket by bucket.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "BATCH_SIZE_BOUNDS",
    "DROP_REASONS",
    "LATENCY_BOUNDS_S",
    "STEP_COUNTERS",
    "GatewayMetrics",
    "Histogram",
    "StepCounters",
    "merge_histograms",
    "quantile",
]

#: Upper bounds (seconds) of the latency histograms' buckets; the last bucket is +Inf.
LATENCY_BOUNDS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: Upper bounds of the batch size histograms' buckets.
BATCH_SIZE_BOUNDS: tuple[float, ...] = (1, 5, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10000)


class Histogram:
    """A cumulative-on-export histogram with fixed bounds; ``observe`` may weigh a value.

    Args:
        bounds: the buckets' upper bounds, ascending (``+Inf`` is implied).

    Example:
        >>> h = Histogram((1.0, 2.0))
        >>> h.observe(1.5, count=10)
        >>> h.snapshot()["counts"], h.snapshot()["count"]
        ([0, 10, 0], 10)
    """

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """Record ``count`` observations of ``value`` (one batch: its latency, weighed by its
        event count)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.count += count
        self.sum += value * count

    def snapshot(self) -> dict[str, Any]:
        """JSON-able: ``bounds``, per-bucket (non-cumulative) ``counts``, ``count``, ``sum``."""
        return {
            "bounds": list(self.bounds),
            "counts": list(self.counts),
            "count": self.count,
            "sum": self.sum,
        }


def merge_histograms(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """Add histogram snapshots bucket by bucket (same bounds); None when there are none.

    Snapshots with other bounds than the first are skipped (a replica of another version).
    """
    out: dict[str, Any] | None = None
    for s in snapshots:
        if out is None:
            out = {
                "bounds": list(s["bounds"]),
                "counts": list(s["counts"]),
                "count": s["count"],
                "sum": s["sum"],
            }
            continue
        if list(s["bounds"]) != out["bounds"]:
            continue
        out["counts"] = [a + b for a, b in zip(out["counts"], s["counts"])]
        out["count"] += s["count"]
        out["sum"] += s["sum"]
    return out


def quantile(snapshot: dict[str, Any] | None, q: float) -> float | None:
    """The ``q`` quantile of a histogram snapshot, interpolated linearly in its bucket (as
    Prometheus's ``histogram_quantile``); None when it is empty.

    A quantile that falls in the +Inf bucket is reported as the highest finite bound.
    """
    if not snapshot or not snapshot["count"]:
        return None
    bounds: Sequence[float] = snapshot["bounds"]
    counts: Sequence[int] = snapshot["counts"]
    rank: float = q * snapshot["count"]
    seen = 0
    for i, c in enumerate(counts):
        if c and seen + c >= rank:
            if i >= len(bounds):
                return float(bounds[-1])
            lower = 0.0 if i == 0 else float(bounds[i - 1])
            return lower + (float(bounds[i]) - lower) * ((rank - seen) / c)
        seen += c
    return float(bounds[-1]) if bounds else math.nan


#: Why a step's input gave no output, each a counter of :class:`StepCounters` (and of the
#: pipeline's totals): ``filtered`` (a predicate said no), ``absorbed`` (held in state: a
#: join waiting for its partner, merged into an aggregate's window), ``errors`` (an
#: expression or function failed on it), ``late`` (after its window closed).
DROP_REASONS: tuple[str, ...] = ("filtered", "absorbed", "errors", "late")
#: The counters a step reports, in the order ``eventbus status`` and the dashboard show them;
#: ``emitted`` counts what the step's timer produced without an incoming event (closed
#: windows, outer-join results).
STEP_COUNTERS: tuple[str, ...] = ("in", "out", *DROP_REASONS, "emitted")


class StepCounters:
    """Per-step counters of a replica's runner, updated once per batch.

    Attributes:
        events_in: events that entered the step.
        events_out: events it output (a step may output several per input, or none).
        filtered: inputs a predicate dropped.
        absorbed: inputs held in the step's state (join, aggregate) that output nothing.
        errors: inputs whose expression or function failed (failed, or dropped by a filter
            that could not evaluate them).
        late: inputs that came after their window closed.
        emitted: events the step's timer produced (closed windows, outer-join results).
        batches: batches it ran.
        seconds: time spent in the step, summed over batches.
    """

    __slots__ = (
        "absorbed",
        "batches",
        "emitted",
        "errors",
        "events_in",
        "events_out",
        "filtered",
        "late",
        "seconds",
    )

    def __init__(self) -> None:
        self.events_in = 0
        self.events_out = 0
        self.filtered = 0
        self.absorbed = 0
        self.errors = 0
        self.late = 0
        self.emitted = 0
        self.batches = 0
        self.seconds = 0.0

    def snapshot(self) -> dict[str, Any]:
        """JSON-able counters, named as :data:`STEP_COUNTERS` (plus batches, seconds)."""
        return {
            "in": self.events_in,
            "out": self.events_out,
            "filtered": self.filtered,
            "absorbed": self.absorbed,
            "errors": self.errors,
            "late": self.late,
            "emitted": self.emitted,
            "batches": self.batches,
            "seconds": self.seconds,
        }


class GatewayMetrics:
    """The gateway's own figures: requests per pipeline, way (``async``/``sync``) and status,
    events accepted, and request latency histograms (in process; ``/metrics`` exports them).

    Example:
        >>> g = GatewayMetrics()
        >>> g.observe("orders", "sync", 200, 0.004, events=1)
        >>> g.snapshot()["requests"]
        [{'pipeline': 'orders', 'mode': 'sync', 'status': 200, 'count': 1}]
    """

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        self.events: dict[tuple[str, str], int] = {}
        self.latency: dict[tuple[str, str], Histogram] = {}
        #: per pipeline: events run synchronously and their outcomes (see :meth:`ran`)
        self.sync: dict[str, dict[str, int]] = {}

    def ran(self, pipeline: str, outcomes: Sequence[Any]) -> None:
        """Count one batch run through a pipeline's replicas (sync calls): its events and
        their outcomes (``consumed``, ``outputs``, ``dropped``, ``failed``). The gateway
        publishes these to Redis, and the pipeline's totals include them."""
        failed = dropped = outputs = 0
        for o in outcomes:
            if not isinstance(o, list):  # a Failure (outcomes: a list of outputs or one)
                failed += 1
            elif o:
                outputs += len(o)
            else:
                dropped += 1
        c = self.sync.get(pipeline)
        if c is None:
            c = self.sync[pipeline] = {"consumed": 0, "outputs": 0, "dropped": 0, "failed": 0}
        c["consumed"] += len(outcomes)
        c["outputs"] += outputs
        c["dropped"] += dropped
        c["failed"] += failed

    def forget(self, pipelines: set[str]) -> None:
        """Drop the sync counters of pipelines not in ``pipelines`` (deleted: a pipeline
        deployed again under the name starts from zero)."""
        for name in list(self.sync):
            if name not in pipelines:
                del self.sync[name]

    def observe(
        self, pipeline: str, mode: str, status: int, seconds: float, events: int = 0
    ) -> None:
        """Count one answered request."""
        key = (pipeline, mode, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        pm = (pipeline, mode)
        if events:
            self.events[pm] = self.events.get(pm, 0) + events
        h = self.latency.get(pm)
        if h is None:
            h = self.latency[pm] = Histogram(LATENCY_BOUNDS_S)
        h.observe(seconds)

    def snapshot(self) -> dict[str, Any]:
        """JSON-able figures."""
        return {
            "requests": [
                {"pipeline": p, "mode": m, "status": s, "count": n}
                for (p, m, s), n in sorted(self.requests.items())
            ],
            "events": [
                {"pipeline": p, "mode": m, "count": n} for (p, m), n in sorted(self.events.items())
            ],
            "latency": [
                {"pipeline": p, "mode": m, "histogram": h.snapshot()}
                for (p, m), h in sorted(self.latency.items())
            ],
        }

    def for_pipeline(self, pipeline: str) -> dict[str, Any]:
        """This pipeline's requests by status, events and p50/p99 per way."""
        out: dict[str, Any] = {}
        for (p, m, s), n in self.requests.items():
            if p == pipeline:
                out.setdefault(m, {"requests": {}, "events": 0})["requests"][str(s)] = n
        for (p, m), n in self.events.items():
            if p == pipeline:
                out.setdefault(m, {"requests": {}, "events": 0})["events"] = n
        for (p, m), h in self.latency.items():
            if p == pipeline:
                snap = h.snapshot()
                entry = out.setdefault(m, {"requests": {}, "events": 0})
                entry["p50_s"] = quantile(snap, 0.5)
                entry["p99_s"] = quantile(snap, 0.99)
        return out
