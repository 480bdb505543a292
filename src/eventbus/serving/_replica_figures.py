"""What a replica's sources publish (``serving.source_placement: replica``): their counters,
the runner's metrics and the replica's start marks to ``keys.stats(pipeline)`` (one entry per
replica, written when they change or at the heartbeat, a final one at the stop), its history
buckets, and its load for the autoscaler; and the readers' side, ``read_stats`` and
``clear_stats``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from eventbus._internal import keys
from eventbus.observability._history import HistoryRecorder
from eventbus.pipelines._runner import PipelineRunner

__all__ = ["ReplicaFigures", "clear_stats", "read_stats"]

log = logging.getLogger("eventbus.serving.sources")

_STATS_EVERY_S = 1.0
_STATS_STALE_S = 15.0


class ReplicaFigures:
    """One replica's published figures.

    Args:
        pipeline: the pipeline's name.
        runner: the replica's step runner (its metrics and batch counters).
        sources: the replica's running sources (the list is read at each look: sources
            appended later count).
        redis_url: where they are published (None: nowhere).
        replica_id: this replica's entry in the hash.
        startup: the replica's start marks (epoch s), published with every entry.
    """

    def __init__(
        self,
        pipeline: str,
        runner: PipelineRunner,
        sources: list[Any],
        redis_url: str | None,
        replica_id: str,
        startup: dict[str, float],
    ) -> None:
        self._pipeline = pipeline
        self._runner = runner
        self._sources = sources
        self._redis_url = redis_url
        self._replica_id = replica_id
        self._startup = startup
        self._history = HistoryRecorder(pipeline, replica_id)
        self._redis: Any = None  # redis.asyncio client, made on first use
        self._load_prev: tuple[float, int, dict[str, int]] | None = None

    def stats(self) -> list[dict[str, int]]:
        """Per source: its counters."""
        return [dict(s.stats()) for s in self._sources]

    def load(self) -> dict[str, float]:
        """Consumer lag of the replica's partitions, batches in flight, events processed and
        records arriving per second (since the previous call), and its partition count. On
        the sources' loop."""
        now = time.monotonic()
        lag = in_flight = consumed = partitions = 0
        ends: dict[str, int] = {}
        for s in self._sources:
            stats = s.stats()
            in_flight += stats.get("in_flight", 0)
            consumed += stats.get("consumed", 0)
            lag += sum(s.lag().values())
            held = s.log_ends()
            partitions += len(held)
            ends.update({k: end for k, end in held.items() if end >= 0})
        prev = self._load_prev
        self._load_prev = (now, consumed, ends)
        rate = arrival = 0.0
        if prev is not None and now > prev[0]:
            dt = now - prev[0]
            rate = max(0, consumed - prev[1]) / dt
            # only partitions held across both readings: a rebalance moves log ends between replicas
            arrival = sum(max(0, e - prev[2][k]) for k, e in ends.items() if k in prev[2]) / dt
        return {
            "eventbus_lag": float(lag),
            "eventbus_in_flight": float(in_flight),
            "eventbus_events_per_s": rate,
            "eventbus_arrival_per_s": arrival,
            "eventbus_partitions": float(partitions),
        }

    async def note_assigned(self, timeout_s: float = 120.0) -> None:
        """Record when every source got its first partitions (the consumer-group join), and
        publish it at once."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            consumers = [
                getattr(getattr(s, "_fetcher", None), "consumer", None) for s in self._sources
            ]
            if all(c is None or c.assignment() for c in consumers):
                self._startup["assigned_at"] = time.time()
                with contextlib.suppress(Exception):
                    await self.write()
                return
            await asyncio.sleep(0.02)

    async def publish_forever(self) -> None:
        """Look every second, write when the counters, the lag or the steps' batch counts
        moved (or at the heartbeat): sync calls run the steps without passing a source."""
        from eventbus.serving._figures import ChangeGate

        gate = ChangeGate()
        while True:
            await asyncio.sleep(_STATS_EVERY_S)
            try:
                signature = (
                    [(s.stats(), s.lag()) for s in self._sources],
                    [c.batches for c in self._runner.counters],
                )
                if gate.due(self._replica_id, signature):
                    await self.write()
            except Exception:
                log.debug("publishing counters failed", exc_info=True)

    async def write(self, final: bool = False) -> None:
        """Publish the replica's entry and history now (``final``: the last, at its stop)."""
        if not self._redis_url:
            return
        if self._redis is None:
            from eventbus._internal.redis_client import connect_async

            self._redis = connect_async(self._redis_url)
        # The runner's snapshot asks stateful steps (join) for their state size in Redis,
        # synchronously: off this loop.
        metrics = await asyncio.to_thread(self._runner.metrics)
        metrics["sources"] = [s.metrics() for s in self._sources]
        body = {"sources": self.stats(), "metrics": metrics}
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        entry = {**body, "at": now, "final": final, "startup": self._startup}
        pipe.hset(keys.stats(self._pipeline), self._replica_id, json.dumps(entry))
        self._history.queue(pipe, body, now)  # the same round trip
        await pipe.execute()
        if final:
            await self._redis.aclose()
            self._redis = None


def read_stats(redis_client: Any, pipeline: str, num_sources: int) -> list[dict[str, int]]:
    """Counters of a pipeline's replica-run sources, summed over its live replicas.

    Replicas that stopped contribute their final counters, so totals do not drop when a
    replica is replaced; stale entries of replicas that died are left out.
    """
    key = keys.stats(pipeline)
    totals: list[dict[str, int]] = [{} for _ in range(num_sources)]
    now = time.time()
    for raw in redis_client.hgetall(key).values():
        entry = json.loads(raw)
        if not entry.get("final") and now - entry["at"] > _STATS_STALE_S:
            continue
        if entry.get("role", "replica") != "replica":  # a gateway's sync counts
            continue
        for i, counters in enumerate(entry["sources"][:num_sources]):
            for k, v in counters.items():
                if k != "in_flight" or not entry.get("final"):
                    totals[i][k] = totals[i].get(k, 0) + v
    return totals


def clear_stats(redis_client: Any, pipeline: str) -> None:
    """Forget a pipeline's counters and history (on delete): one ``DEL`` (one hash tag)."""
    from eventbus.observability._history import bucket_keys

    redis_client.delete(keys.stats(pipeline), *bucket_keys(pipeline))
