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
from dataclasses import dataclass, field
from typing import Any

from eventbus._internal import keys
from eventbus.eventing._aiokafka_adapter import refresh_metadata
from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs
from eventbus.pipelines._config import PipelineConfig

__all__ = ["REREAD_S", "SCALED_TO_ZERO", "SETTLE_S", "ScaleToZero", "Watched", "decide"]

log = logging.getLogger("eventbus.serving.scale_to_zero")

#: The status of a pipeline whose replicas were scaled to zero.
SCALED_TO_ZERO = "SCALED_TO_ZERO"
#: After a pipeline went to zero, its replicas' drain may still commit for this long.
SETTLE_S = 5.0
#: A pipeline at zero has its committed offsets read again this often (someone else may
#: commit for its group: an operator's reset with another tool; ``eventbus replay`` wakes
#: the pipeline first). Each read is two requests per group and a ``ListOffsets`` through
#: aiokafka: every 60 s, fifty pipelines at zero kept the watcher reading almost every second.
REREAD_S = 300.0


@dataclass
class Watched:
    """What the watcher knows of one ``min: 0`` pipeline."""

    name: str
    #: cluster (bootstrap servers) -> consumer group -> topics
    groups: dict[str, dict[str, list[str]]]
    clients: dict[str, KafkaClientConfig | None]
    idle_s: float
    poll_s: float
    last_activity: float = field(default_factory=time.monotonic)
    last_event_at: float = field(default_factory=time.time)
    committed: dict[str, int] = field(default_factory=dict)
    wake_at: float = 0.0
    next_at: float = 0.0
    busy: bool = False  # a scale action is running
    committed_read_at: float = 0.0  # epoch s of the last OffsetFetch
    fetched: dict[str, int] = field(default_factory=dict)  # what it answered
    zero_since: float | None = None  # epoch s it went to zero (as of the last check)
    nudged: bool = False  # the ringer saw records wait: checked now, not at next_at
    #: (committed_read_at it was made of, (topic, partition) -> committed offset)
    marks: tuple[float, dict[tuple[str, int], int]] = (0.0, {})
    #: when the ringer last compared these marks with the partitions' ends (monotonic), and
    #: how often it does: while that is at least every ``poll_s``, the watcher's own read of
    #: a pipeline at zero is left to it (see :meth:`ScaleToZero.looked`)
    looked_at: float = float("-inf")
    looked_every_s: float = float("inf")


def decide(
    w: Watched,
    *,
    now: float,
    lag: int,
    committed: dict[str, int],
    wake_at: float,
    at_zero_since: float | None,
    replica_lag: int = 0,
) -> str | None:
    """Update ``w`` with one observation; ``"down"``, ``"up"`` or None (nothing to do).

    Args:
        now: monotonic time.
        lag: records past the committed offsets, summed over partitions (end - committed).
        committed: the committed offsets (``topic[partition]`` -> offset).
        wake_at: the latest sync call a gateway recorded (epoch s).
        at_zero_since: when the pipeline went to zero (epoch s); None: it runs.
        replica_lag: the lag the replicas last published (their fetches' view).
    """
    moved = bool(w.committed) and committed != w.committed
    called = wake_at > w.wake_at
    w.committed, w.wake_at = committed, max(w.wake_at, wake_at)
    if moved or called or lag > 0 or replica_lag > 0:
        w.last_activity = now
        if moved or called:
            w.last_event_at = time.time()
    if at_zero_since is not None:
        return "up" if lag > 0 or wake_at > at_zero_since else None
    if now - w.last_activity >= w.idle_s:
        return "down"
    return None


def watched_of(
    config: PipelineConfig, bootstrap: str, client: KafkaClientConfig | None
) -> Watched | None:
    """The watch of a pipeline, or None when it may not scale to zero."""
    bounds = config.spec.serving.replica_bounds
    if not bounds.scale_to_zero:
        return None
    groups: dict[str, dict[str, list[str]]] = {}
    clients: dict[str, KafkaClientConfig | None] = {}
    for src in config.consumed_sources:
        cluster = src.bootstrap_servers or bootstrap
        clients.setdefault(cluster, src.client or client)
        group = src.group or f"eventbus-{config.name}"
        groups.setdefault(cluster, {}).setdefault(group, []).extend(src.topics)
    return Watched(config.name, groups, clients, bounds.idle_s, bounds.poll_s)


def _marks(fetched: dict[str, int], groups: dict[str, list[str]]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> committed offset of ``fetched`` (``group/topic[p]`` -> offset)
    for ``groups``; a partition of two groups: the lower offset."""
    marks: dict[tuple[str, int], int] = {}
    for name, offset in fetched.items():
        group, _, tp = name.rpartition("/")
        topic, _, part = tp.rpartition("[")
        if group not in groups:
            continue
        key = (topic, int(part.rstrip("]")))
        marks[key] = min(offset, marks.get(key, offset))
    return marks


def _left_to_the_ringer(w: Watched, now: float, wake_at: float) -> bool:
    """Whether the ringer's looks cover ``w`` this round: it is at zero, no sync call came
    since, its committed offsets are younger than :data:`REREAD_S`, and the ringer compared
    them with the ends within the last ``poll_s`` (plus one of its rounds, its own pace) and
    looks at least every ``poll_s``. Otherwise the watcher reads it itself."""
    if w.zero_since is None or w.nudged or wake_at > w.zero_since:
        return False
    if time.time() - w.committed_read_at >= REREAD_S or w.looked_every_s > w.poll_s:
        return False
    return now - w.looked_at < w.poll_s + w.looked_every_s


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
                    w.marks = (w.committed_read_at, _marks(w.fetched, w.groups[self.bootstrap]))
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
        due = [w for w in due if not _left_to_the_ringer(w, now, float(wakes.get(w.name, 0)))]
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
