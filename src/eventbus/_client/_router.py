"""Which cluster a request goes to: weights, local preference, mark-downs, failover timing."""

from __future__ import annotations

import copy
import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eventbus._client._registry import ClusterInfo
from eventbus._internal.backoff import Backoff

__all__ = ["ClientStats", "ClusterStats", "Unavailable"]

log = logging.getLogger("eventbus.client")

#: The random part of a failed cluster's mark-down period (0.5: 50-100 % of it).
MARK_DOWN_JITTER = 0.5


@dataclass
class ClusterStats:
    """Counters of one cluster as this client saw it."""

    requests: int = 0
    failures: int = 0
    events_accepted: int = 0
    down_until: float = 0.0


@dataclass
class ClientStats:
    """What the client did: per-cluster counters and the failovers it measured.

    Attributes:
        clusters: name -> :class:`ClusterStats`.
        failovers: failovers completed (a request failed on one cluster, then one succeeded
            on another).
        failover_s: each failover's time, from the start of the first failed request to the
            end of the first successful one on another cluster sent after the failure was seen.
    """

    clusters: dict[str, ClusterStats] = field(default_factory=dict)
    failovers: int = 0
    failover_s: list[float] = field(default_factory=list)

    @property
    def last_failover_s(self) -> float | None:
        """The most recent failover time, or None."""
        return self.failover_s[-1] if self.failover_s else None


class Unavailable(Exception):
    """A cluster did not take a request; try the next. ``mark_down``: it is unhealthy (not a 404)."""

    def __init__(self, reason: str, *, mark_down: bool = True, status: int = 503) -> None:
        super().__init__(reason, mark_down, status)
        self.reason = reason
        self.mark_down = mark_down
        self.status = status

    def __str__(self) -> str:
        return self.reason


class _Router:
    """Which clusters to try, in order; thread-safe (one lock around tiny critical sections)."""

    def __init__(
        self,
        *,
        prefer_local: bool,
        local_cluster: str | None,
        seed: int | None,
        backoff_s: float,
        max_backoff_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.prefer_local = prefer_local
        self.local_cluster = local_cluster
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.clusters: list[ClusterInfo] = []
        self.stats = ClientStats()
        self._rng = random.Random(seed)
        # A failed cluster is skipped for 50-100 % of its capped, doubling period: clients
        # that saw it fail together do not all come back to it at once.
        self._mark_down = Backoff(backoff_s, max_backoff_s, jitter=MARK_DOWN_JITTER)
        self._failures: dict[str, int] = {}  # failures in a row, per cluster
        self._marked_at: dict[str, float] = {}
        # (cluster that failed, start of the failed request, when it was marked down)
        self._pending: tuple[str, float, float] | None = None
        self._lock = threading.Lock()

    def update(self, clusters: Sequence[ClusterInfo]) -> None:
        with self._lock:
            self.clusters = list(clusters)
            for c in clusters:
                self.stats.clusters.setdefault(c.name, ClusterStats())

    def _is_local(self, c: ClusterInfo) -> bool:
        return c.name == self.local_cluster if self.local_cluster is not None else c.local

    def _weighted_order(self, items: list[ClusterInfo]) -> list[ClusterInfo]:
        out, pool = [], list(items)
        while pool:
            total = sum(c.weight for c in pool)
            x = self._rng.uniform(0, total)
            for i, c in enumerate(pool):
                x -= c.weight
                if x <= 0 or i == len(pool) - 1:
                    out.append(pool.pop(i))
                    break
        return out

    def order(self) -> list[ClusterInfo]:
        """Up clusters with weight > 0 (local first, then drawn by weight), then up clusters
        of weight 0, then the clusters marked down, soonest back first."""
        now = self.clock()
        with self._lock:
            st = self.stats.clusters
            up = [c for c in self.clusters if st[c.name].down_until <= now]
            down = sorted(
                (c for c in self.clusters if st[c.name].down_until > now),
                key=lambda c: st[c.name].down_until,
            )
            weighted = [c for c in up if c.weight > 0]
            local = [c for c in weighted if self.prefer_local and self._is_local(c)]
            rest = [c for c in weighted if c not in local]
            return [
                *self._weighted_order(local),
                *self._weighted_order(rest),
                *(c for c in up if c.weight == 0),
                *down,
            ]

    def failed(self, cluster: ClusterInfo, started: float, exc: Unavailable) -> None:
        with self._lock:
            st = self.stats.clusters.setdefault(cluster.name, ClusterStats())
            st.requests += 1
            st.failures += 1
            if not exc.mark_down:
                return
            now = self.clock()
            # Requests already in flight when the cluster was marked down fail too: they
            # neither lengthen the backoff nor restart it.
            if started < self._marked_at.get(cluster.name, float("-inf")):
                return
            failures = self._failures[cluster.name] = self._failures.get(cluster.name, 0) + 1
            backoff = self._mark_down.delay(failures, self._rng)
            self._marked_at[cluster.name] = now
            st.down_until = now + backoff
            if self._pending is None:
                self._pending = (cluster.name, started, now)
        log.warning(
            "cluster %s did not answer (%s); marked down for %.1f s", cluster.name, exc, backoff
        )

    def succeeded(self, cluster: ClusterInfo, started: float, events: int) -> None:
        now = self.clock()
        with self._lock:
            st = self.stats.clusters.setdefault(cluster.name, ClusterStats())
            st.requests += 1
            st.events_accepted += events
            # A request sent before the cluster was marked down says nothing about it now.
            if started >= self._marked_at.get(cluster.name, float("-inf")):
                st.down_until = 0.0
                self._failures.pop(cluster.name, None)
            # Only a request sent after the failure was seen shows the failover: one already in
            # flight to another cluster would have succeeded anyway.
            if self._pending is not None and started >= self._pending[2]:
                failed, first_started, _ = self._pending
                self._pending = None
                if failed != cluster.name:  # else it recovered before another cluster answered
                    self.stats.failovers += 1
                    self.stats.failover_s.append(now - first_started)

    def snapshot(self) -> ClientStats:
        with self._lock:
            return copy.deepcopy(self.stats)
