"""Scale to zero (``serving.replicas.min: 0``): one watcher in the controller for every such
pipeline, as KEDA's Kafka scaler does it.

Every ``poll_s`` the watcher compares, per pipeline, the end offsets of its consumed topics
(the Kafka sources' and the gateway's ingress topic) with its consumer groups' committed
offsets: one ``ListOffsets`` for all topics of a cluster and one ``OffsetFetch`` per group, not
a consumer per pipeline, so a pipeline at zero costs no replica and no group member.

* Up: after ``idle_s`` with no committed offset moving, no lag, and no sync call at a gateway
  (gateways record those in ``eventbus:wake``), the pipeline's Serve application is set to
  zero replicas; the replicas drain and commit as on any scale-down. The pipeline is recorded
  in ``eventbus:scaled-to-zero`` (since, last event time), which status, the dashboard and
  ``/metrics`` read.
* At zero: lag on any partition (an end offset past the committed one: events wait, in the
  source topics or in the ingress topic, where the gateway writes async requests) or a sync
  call newer than the scale-down brings the application back to its configured replicas.
  Nothing is lost: what waits in a topic is consumed from the committed offsets.

The end offset is the broker's ``ListOffsets`` answer. Tansu answers it with the last record
batch's base offset + 1, which can be below the true end; it is above the committed offset as
soon as a new batch arrives after the committed one, so waking is exact, and scaling down
also requires the replicas' own lag (from their fetches' high watermarks) to be zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from eventbus._internal import keys
from eventbus.eventing._aiokafka_adapter import refresh_metadata
from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._zero_watch import (
    REREAD_S,
    SCALED_TO_ZERO,
    SETTLE_S,
    Watched,
    committed_marks,
    decide,
    left_to_the_ringer,
    watched_of,
)

# the decisions are _zero_watch's; their names stay importable from here
__all__ = [
    "REREAD_S",
    "SCALED_TO_ZERO",
    "SETTLE_S",
    "ScaleToZero",
    "Watched",
    "decide",
    "watched_of",
]

log = logging.getLogger("eventbus.serving.scale_to_zero")


class ScaleToZero:
    """The watcher: a daemon thread with its own event loop and Kafka clients.

    Args:
        redis: a sync Redis client (``decode_responses=True``).
        scale: ``scale(name, zero, last_event_at, woken_by)`` applies a decision and records
            it in ``eventbus:scaled-to-zero`` (the controller's, under its lock); ``woken_by``
            says who saw the events of a wake-up: ``"doorbell"`` (the ringer's look) or
            ``"poll"`` (this watcher's own, every ``poll_s``).
        bootstrap: the stack's Kafka bootstrap servers.
        client: the stack's Kafka connection settings.
    """

    def __init__(
        self,
        redis: Any,
        scale: Callable[[str, bool, float, str], None],
        bootstrap: str,
        client: KafkaClientConfig | None,
    ) -> None:
        self._redis = redis
        self._scale = scale
        self.bootstrap = bootstrap
        self.client = client
        self._watched: dict[str, Watched] = {}
        self._lock = threading.Lock()
        self._consumers: dict[str, Any] = {}
        self._admins: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nudge: asyncio.Event | None = None  # set by nudge(): the watcher looks now
        self._thread = threading.Thread(
            target=self._main, name="eventbus-scale-to-zero", daemon=True
        )

    # -- the controller's side ----------------------------------------------------------------
    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def track(self, config: PipelineConfig) -> None:
        """Watch ``config``'s pipeline when it has ``min: 0`` (again from now: a deploy is
        activity); forget it otherwise."""
        w = watched_of(config, self.bootstrap, self.client)
        with self._lock:
            if w is None:
                self._watched.pop(config.name, None)
            else:
                self._watched[config.name] = w

    def forget(self, name: str) -> None:
        """Stop watching a pipeline (deleted)."""
        with self._lock:
            self._watched.pop(name, None)

    def state(self, name: str) -> dict[str, Any] | None:
        """``{"since", "last_event_at"}`` of a pipeline at zero, or None."""
        raw = self._redis.hget(keys.SCALED_TO_ZERO, name)
        return json.loads(raw) if raw else None

    def wake_marks(self) -> dict[str, dict[tuple[str, int], int]]:
        """Per pipeline at zero whose committed offsets were read after its drain: (topic,
        partition) -> committed offset, on the stack's Kafka (the ringer looks there; a
        partition consumed by two groups: the lower offset)."""
        out: dict[str, dict[tuple[str, int], int]] = {}
        with self._lock:
            for w in self._watched.values():
                since = w.zero_since
                if since is None or w.busy or w.committed_read_at <= since + SETTLE_S:
                    continue
                if self.bootstrap not in w.groups:
                    continue
                if w.marks[0] != w.committed_read_at:  # made once per OffsetFetch
                    w.marks = (
                        w.committed_read_at,
                        committed_marks(w.fetched, w.groups[self.bootstrap]),
                    )
                if w.marks[1]:
                    out[w.name] = w.marks[1]
        return out

    def looked(self, names: Iterable[str], every_s: float) -> None:
        """The ringer compared the marks of ``names`` (from :meth:`wake_marks`) with their
        partitions' ends just now, and does so every ``every_s``: while that keeps a pipeline
        at zero covered at least every ``poll_s``, this watcher does not read its ends too (its
        ``ListOffsets`` through aiokafka cost the controller and the broker more than the
        ringer's look at every pipeline at zero); a nudge or a sync call still checks it at
        once, and its committed offsets are read again every :data:`REREAD_S`."""
        now = time.monotonic()
        with self._lock:
            for name in names:
                w = self._watched.get(name)
                if w is not None:
                    w.looked_at, w.looked_every_s = now, every_s

    def nudge(self, name: str) -> None:
        """Check ``name`` now (the ringer saw records past its committed offsets)."""
        with self._lock:
            w = self._watched.get(name)
            if w is None:
                return
            w.next_at, w.nudged = 0.0, True
        loop, event = self._loop, self._nudge
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)

    # -- the thread ---------------------------------------------------------------------------
    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._nudge = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                watched = list(self._watched.values())
            pause = min((w.poll_s for w in watched), default=1.0)
            self._nudge.clear()
            try:
                await self._tick(watched)
            except Exception:  # Redis or Kafka away: try again next tick
                log.warning("scale to zero: a check failed", exc_info=True)
            # a nudge ends the pause at once
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._nudge.wait(), pause)

    async def _tick(self, watched: list[Watched]) -> None:
        now = time.monotonic()
        due = [w for w in watched if now >= w.next_at and not w.busy]
        if not due:
            return
        wakes = self._redis.hgetall(keys.WAKE)
        zero = self._redis.hgetall(keys.SCALED_TO_ZERO)
        zero_since = {n: float(json.loads(raw)["since"]) for n, raw in zero.items()}
        for w in due:
            w.next_at = now + w.poll_s
            w.zero_since = zero_since.get(w.name)
        due = [w for w in due if not left_to_the_ringer(w, now, float(wakes.get(w.name, 0)))]
        if not due:
            return
        observed = await self.observe(due, zero_since)
        for w in due:
            if w.name not in observed:
                continue  # its cluster could not be read: logged, retried next time
            lag, committed = observed[w.name]
            since = zero_since.get(w.name)
            replica_lag = 0 if since is not None or lag > 0 else self._replica_lag(w.name)
            action = decide(
                w,
                now=now,
                lag=lag,
                committed=committed,
                wake_at=float(wakes.get(w.name, 0)),
                at_zero_since=since,
                replica_lag=replica_lag,
            )
            woken_by = "doorbell" if w.nudged else "poll"
            w.nudged = False
            if action is not None:
                w.busy = True
                asyncio.get_running_loop().run_in_executor(None, self._apply, w, action, woken_by)

    def _apply(self, w: Watched, action: str, woken_by: str) -> None:
        try:
            if action == "down":
                log.info("pipeline %r: idle for %g s, scaling to zero", w.name, w.idle_s)
                self._scale(w.name, True, w.last_event_at, woken_by)
            else:
                log.info("pipeline %r: events wait (%s), scaling up from zero", w.name, woken_by)
                self._scale(w.name, False, w.last_event_at, woken_by)
                w.last_activity = time.monotonic()
        except Exception:
            log.exception("pipeline %r: scaling %s failed", w.name, action)
        finally:
            w.busy = False

    def _replica_lag(self, name: str) -> int:
        """The lag the pipeline's live replicas last published (0 when none did)."""
        from eventbus.observability._view import STALE_S

        total = 0
        now = time.time()
        for raw in self._redis.hvals(keys.stats(name)):
            entry = json.loads(raw)
            if entry.get("final") or now - entry.get("at", 0) > STALE_S:
                continue
            for src in (entry.get("metrics") or {}).get("sources") or []:
                total += sum((src.get("lag") or {}).values())
        return total

    async def observe(
        self, due: list[Watched], zero_since: dict[str, float]
    ) -> dict[str, tuple[int, dict[str, int]]]:
        """Per pipeline of ``due`` that could be read: its lag summed over its partitions, and
        its committed offsets (``group/topic[partition]`` -> offset).

        One ``ListOffsets`` per cluster for every due pipeline's partitions together, and one
        ``OffsetFetch`` per group of the running pipelines: a pipeline at zero has no member
        that commits, so its committed offsets are read once after it went to zero (plus
        :data:`SETTLE_S`, for the drain's last commits) and again every :data:`REREAD_S`. What
        grows with the pipelines at zero is the size of one request, not the requests.
        """
        from aiokafka import TopicPartition

        plan: dict[str, list[tuple[Watched, str, list[TopicPartition]]]] = {}
        for w in due:
            for cluster, groups in w.groups.items():
                try:
                    consumer, _ = await self._clients(cluster, w.clients.get(cluster))
                    for group, topics in groups.items():
                        tps: list[TopicPartition] = []
                        for topic in topics:
                            parts = consumer.partitions_for_topic(topic)
                            if not parts:
                                await refresh_metadata(consumer)
                                parts = consumer.partitions_for_topic(topic) or set()
                            tps.extend(TopicPartition(topic, p) for p in sorted(parts))
                        if tps:
                            plan.setdefault(cluster, []).append((w, group, tps))
                except Exception as e:  # noqa: BLE001 - one cluster away: not the others
                    log.warning("pipeline %r: reading %s failed (%s); retrying", w.name, cluster, e)
        now = time.time()
        out: dict[str, tuple[int, dict[str, int]]] = {w.name: (0, {}) for w in due}
        failed: set[str] = set()
        for cluster, items in plan.items():
            consumer, admin = self._consumers[cluster], self._admins[cluster]
            try:
                ends = await consumer.end_offsets(sorted({tp for _, _, tps in items for tp in tps}))
            except Exception as e:  # noqa: BLE001
                log.warning("ListOffsets on %s failed (%s); retrying", cluster, e)
                failed.update(w.name for w, _, _ in items)
                continue
            for w, group, tps in items:
                names = [f"{group}/{tp.topic}[{tp.partition}]" for tp in tps]
                since = zero_since.get(w.name)
                fresh = (
                    since is not None
                    and w.committed_read_at > since + SETTLE_S
                    and now - w.committed_read_at < REREAD_S
                    and all(n in w.fetched for n in names)
                )
                if fresh:
                    offsets = [w.fetched[n] for n in names]
                else:
                    try:
                        done = await admin.list_consumer_group_offsets(group, partitions=tps)
                    except Exception as e:  # noqa: BLE001
                        log.warning("pipeline %r: OffsetFetch failed (%s); retrying", w.name, e)
                        failed.add(w.name)
                        continue
                    offsets = []
                    for tp in tps:
                        meta = done.get(tp)
                        offsets.append(meta.offset if meta is not None and meta.offset >= 0 else 0)
                    w.committed_read_at = now
                    w.fetched.update(zip(names, offsets, strict=True))
                lag, committed = out[w.name]
                for tp, n, offset in zip(tps, names, offsets, strict=True):
                    committed[n] = offset
                    lag += max(0, ends.get(tp, 0) - offset)
                out[w.name] = (lag, committed)
        return {k: v for k, v in out.items() if k not in failed}

    async def _clients(self, cluster: str, client: KafkaClientConfig | None) -> tuple[Any, Any]:
        consumer = self._consumers.get(cluster)
        if consumer is None:
            from aiokafka import AIOKafkaConsumer
            from aiokafka.admin import AIOKafkaAdminClient

            kwargs = kafka_client_kwargs(client)
            consumer = AIOKafkaConsumer(
                bootstrap_servers=cluster, client_id="eventbus-scale-to-zero", **kwargs
            )
            await consumer.start()
            admin = AIOKafkaAdminClient(
                bootstrap_servers=cluster, client_id="eventbus-scale-to-zero", **kwargs
            )
            await admin.start()
            self._consumers[cluster], self._admins[cluster] = consumer, admin
        return consumer, self._admins[cluster]
