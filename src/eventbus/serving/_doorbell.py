"""The doorbell of idle Kafka sources: one watcher rings them when records arrive, so that an
idle replica sends no fetch at all and still takes its first event within tens of ms.

* A replica's idle source (no record for ``IDLE_AFTER_S``) parks: it pauses its partitions,
  records ``{"ends": {"topic[p]": log end it saw}, "at": t}`` under its parked id in
  ``eventbus:parked`` and waits for a message on its channel ``eventbus:doorbell:<id>``
  (:class:`RedisDoorbell`).
* The controller's :class:`Ringer` reads ``eventbus:parked`` every :data:`RING_EVERY_S`; when
  something is parked it sends one ``ListOffsets`` for all parked partitions (aiokafka's
  client over connections it keeps: ``_end_offsets``) and publishes to the channel of each source whose
  partition end moved past what it saw. The same look covers, every :data:`ZERO_LOOK_S`
  (slower with many partitions: :func:`zero_look_every`), the partitions of the pipelines at
  zero: records past a committed offset nudge the scale-to-zero watcher, which wakes the
  pipeline without waiting for its ``poll_s``. Tansu answers
  ``ListOffsets`` with the last record batch's base offset + 1: any batch that arrives after
  the source's last fetch puts it past the log end that fetch saw, so no arrival is missed.
* What it costs does not grow with idle pipelines: while any source is parked, one
  ``ListOffsets`` per tick, and one Redis read of the parked entries when a source parked (its
  notice) or once every :data:`PARKED_REREAD_S`; with none parked (every pipeline at zero) no tick: the
  ringer waits for a parking source's notice (``eventbus:parked-notice``), looking once a
  second anyway. A parked source costs its consumer group heartbeats and one fetch every
  ``PARK_MAX_S`` (the fallback when no ring comes). With pipelines at zero and none parked,
  one look every :func:`zero_look_every` (at most ~0.4% of a core, broker included).

Only the sources that read the stack's own Kafka (the ringer's) get a doorbell, and only on
a plain or TLS Redis (not a Redis Cluster); the others long-poll (``idle_fetch_max_wait_ms``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from eventbus._internal import keys
from eventbus.eventing._kafka_client import KafkaClientConfig

__all__ = [
    "RING_EVERY_S",
    "STALE_S",
    "ZERO_LOOK_MAX_S",
    "ZERO_LOOK_PER_PARTITION_S",
    "ZERO_LOOK_S",
    "RedisDoorbell",
    "Ringer",
    "ZeroWatch",
    "due_rings",
    "zero_look_every",
]

log = logging.getLogger("eventbus.serving.doorbell")

#: How often the ringer looks at the parked sources' partitions (the first event after
#: idleness waits about half of it, plus one fetch).
#: 20 looks a second while a source is parked (Tansu only): ~1.4% of a core (~0.7 ms of CPU a
#: look through aiokafka's client, 10 partitions, on a shared 2-core machine; the hand-packed
#: ListOffsets it replaced took ~0.3 ms there, without TLS, SASL or version negotiation).
RING_EVERY_S = 0.05
#: How often, at most, the ringer looks at the partitions of the pipelines at zero (a cold
#: start's detection waits about half of it). Each look costs the broker and the controller
#: per partition (Tansu ~5 µs, the ringer ~5 µs: aiokafka encodes and decodes each), so the pace
#: slows with the partitions looked at, :data:`ZERO_LOOK_PER_PARTITION_S` each, up to
#: :data:`ZERO_LOOK_MAX_S`: what the looks cost stays under ~0.4% of a core however many
#: pipelines are at zero (50 pipelines of 4 partitions: every 0.5 s; every 0.2 s they took
#: ~1% of a core, the broker and the controller together).
ZERO_LOOK_S = 0.2
#: The slowest pace (the default ``poll_s``: the watcher leaves a pipeline at zero to the
#: ringer only while it looks at least every ``poll_s``).
ZERO_LOOK_MAX_S = 1.0
#: The pace per partition looked at.
ZERO_LOOK_PER_PARTITION_S = 0.0025


def zero_look_every(partitions: int) -> float:
    """How often the ringer looks at ``partitions`` partitions of pipelines at zero."""
    return min(ZERO_LOOK_MAX_S, max(ZERO_LOOK_S, partitions * ZERO_LOOK_PER_PARTITION_S))


#: A parked entry not refreshed for this long belongs to a replica that died: dropped.
STALE_S = 60.0
#: With nothing parked the ringer waits for a source's notice, looking anyway this often.
IDLE_LOOK_S = 1.0
#: While sources are parked the ringer reads ``eventbus:parked`` again when a parking notice
#: came, and at least this often (an entry's removal sends none): between, it reuses what it
#: read (a ``HGETALL`` was ~40% of a look's CPU with 10 parked sources).
PARKED_REREAD_S = 1.0


class ZeroWatch(Protocol):
    """The scale-to-zero watcher, as the ringer sees it."""

    def wake_marks(self) -> Mapping[str, Mapping[tuple[str, int], int]]:
        """Per pipeline at zero: (topic, partition) -> its committed offset (the stack's
        Kafka only)."""

    def nudge(self, name: str) -> None:
        """Records wait past a pipeline's committed offsets: check it now."""

    def looked(self, names: Iterable[str], every_s: float) -> None:
        """The ringer compared the marks of ``names`` with the ends just now, and does so
        every ``every_s``."""


def _drain_notices(notices: Any, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for a parked notice, then take every one that is waiting.
    Whether any came."""
    msg = notices.get_message(timeout=timeout_s)
    came = msg is not None
    while msg is not None:
        msg = notices.get_message(timeout=0)
    return came


class RedisDoorbell:
    """A parked source's side: record what it saw, wait for its channel.

    Args:
        redis_url: the stack's Redis.
        parked_id: ``<replica id>/<source index>``: unique per source of a live replica.
    """

    def __init__(self, redis_url: str, parked_id: str) -> None:
        self.redis_url = redis_url
        self.parked_id = parked_id
        self._redis: Any = None
        self._pubsub: Any = None

    async def wait(self, ends: Mapping[str, int]) -> None:
        """Park until rung (see :class:`~eventbus.eventing.sources._kafka_settings.Doorbell`).

        Raises:
            redis.RedisError: Redis refused (no pub/sub for this user) or is away.
        """
        if self._pubsub is None:
            from eventbus._internal.redis_client import connect_async

            self._redis = connect_async(self.redis_url)
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(keys.doorbell(self.parked_id))
            self._pubsub = pubsub
        while await self._pubsub.get_message(timeout=0) is not None:
            pass  # rings of an earlier park, answered by its fetch already
        entry = json.dumps({"ends": dict(ends), "at": time.time()})
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(keys.PARKED, self.parked_id, entry)
        pipe.publish(keys.PARKED_NOTICE, self.parked_id)  # an idle ringer looks at once
        await pipe.execute()
        try:
            while await self._pubsub.get_message(timeout=None) is None:
                pass  # None: the subscription's own reply
        finally:
            await asyncio.shield(self._redis.hdel(keys.PARKED, self.parked_id))

    async def close(self) -> None:
        """Unsubscribe and close the connections (idempotent)."""
        pubsub, self._pubsub = self._pubsub, None
        redis, self._redis = self._redis, None
        if pubsub is not None:
            await pubsub.aclose()
        if redis is not None:
            await redis.hdel(keys.PARKED, self.parked_id)
            await redis.aclose()


def due_rings(
    parked: Mapping[str, str], ends: Mapping[str, int], now: float
) -> tuple[list[str], list[str]]:
    """Which parked sources to ring, and which entries are stale.

    Args:
        parked: ``eventbus:parked`` (parked id -> JSON entry).
        ends: ``topic[partition]`` -> the broker's log end now (``ListOffsets``).
        now: epoch s.
    """
    ring, stale = [], []
    for parked_id, raw in parked.items():
        entry = _parse(raw)
        if entry is None:
            stale.append(parked_id)
            continue
        seen, at = entry
        if now - at > STALE_S:
            stale.append(parked_id)
        elif any(ends.get(tp, 0) > max(end, 0) for tp, end in seen.items()):
            ring.append(parked_id)
    return ring, stale


@functools.lru_cache(maxsize=4096)
def _parse(raw: str) -> tuple[dict[str, int], float] | None:
    """A parked entry's (ends, at), or None when malformed (read again at every look while
    parked: parsed once)."""
    try:
        entry = json.loads(raw)
        ends = {str(k): int(v) for k, v in entry["ends"].items()}
        return ends, float(entry["at"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _partitions(parked: Mapping[str, str]) -> set[tuple[str, int]]:
    out = set()
    for raw in parked.values():
        entry = _parse(raw)
        for name in entry[0] if entry is not None else ():
            topic, _, part = name.rpartition("[")
            try:
                out.add((topic, int(part.rstrip("]"))))
            except ValueError:
                continue
    return out


class Ringer:
    """The controller's side: a daemon thread (no event loop) with one cheap look at the
    partitions' ends (:mod:`~eventbus.serving._end_offsets`).

    It also looks, every :func:`zero_look_every`, at the partitions of the pipelines at zero
    (``zero``: the scale-to-zero watcher's :meth:`wake_marks`) and nudges the watcher as soon
    as one has records past its committed offset: the wake-up starts within one look of the
    event (0.2 s with up to 80 partitions at zero, 0.5 s with 200), not at the watcher's next
    ``poll_s``.

    Args:
        redis: a sync Redis client (``decode_responses=True``).
        bootstrap: the stack's Kafka (the parked sources read it).
        client: its connection settings.
        zero: the scale-to-zero watcher (None: parked sources only).
    """

    def __init__(
        self,
        redis: Any,
        bootstrap: str,
        client: KafkaClientConfig | None,
        zero: ZeroWatch | None = None,
    ) -> None:
        self._redis = redis
        self.bootstrap = bootstrap
        self.client = client
        self.zero = zero
        self._looker: Any = None
        self._rung: dict[str, str] = {}  # parked id -> the entry it was rung for (once each)
        self._parked: dict[str, str] | None = None  # what was read last (None: read again)
        self._parked_at = 0.0  # when (monotonic)
        self._zero_at = 0.0  # the last look at the pipelines at zero (monotonic)
        self._nudged: dict[str, Mapping[tuple[str, int], int]] = {}  # name -> marks nudged for
        self._zero_any = False  # whether some pipeline was at zero at the last look
        self._zero_every = ZERO_LOOK_S  # their pace (zero_look_every of their partitions)
        #: rings sent so far
        self.rings = 0
        #: nudges of the scale-to-zero watcher so far
        self.nudges = 0
        self._thread = threading.Thread(target=self._main, name="eventbus-doorbell", daemon=True)

    def start(self) -> None:
        """Start ringing."""
        self._thread.start()

    def _main(self) -> None:
        notices: Any = None
        busy = False
        while True:
            try:
                if notices is None:  # subscribed for good: a notice while looking waits
                    notices = self._subscribe()
                pause = RING_EVERY_S if busy else self._zero_pause()
                if notices is False:
                    time.sleep(pause)
                elif _drain_notices(notices, pause):
                    self._parked = None  # a source parked: read the entries again
                busy = self.tick()
            except Exception as e:  # noqa: BLE001 - Redis or Kafka away: next tick
                log.warning("doorbell: a check failed (%s)", e)
                notices = None if notices is not False else False
                self._close_looker()
                busy = False
                time.sleep(1.0)

    def _zero_pause(self) -> float:
        """Nothing parked: wait for a parking notice up to the next look at the pipelines at
        zero (or :data:`IDLE_LOOK_S` when none is)."""
        return self._zero_every if self._zero_any else IDLE_LOOK_S

    def _subscribe(self) -> Any:
        """The parked notices' subscription, or False: this Redis refuses pub/sub (a cluster,
        an ACL without channels; its replicas' sources long-poll then), look every second."""
        try:
            notices = self._redis.pubsub(ignore_subscribe_messages=True)
            notices.subscribe(keys.PARKED_NOTICE)
        except Exception as e:  # noqa: BLE001
            log.info("doorbell: no pub/sub on this Redis (%s); looking every %g s", e, IDLE_LOOK_S)
            return False
        return notices

    def tick(self) -> bool:
        """Look once: ring the parked sources whose partitions got records, and nudge the
        watcher for the pipelines at zero that got some. False: nothing is parked."""
        now = time.monotonic()
        parked = self._parked
        if parked is None or now - self._parked_at >= PARKED_REREAD_S:
            parked = self._parked = self._redis.hgetall(keys.PARKED)
            self._parked_at = now
        self._rung = {k: v for k, v in self._rung.items() if parked.get(k) == v}
        if not parked:
            self._parked = None  # the next look (after a notice) reads them
        marks: Mapping[str, Mapping[tuple[str, int], int]] = {}
        if self.zero is not None and now - self._zero_at >= self._zero_every * 0.9:
            marks = self.zero.wake_marks()
            self._zero_at, self._zero_any = now, bool(marks)
            self._zero_every = zero_look_every(sum(len(m) for m in marks.values()))
        self._nudged = {k: v for k, v in self._nudged.items() if marks.get(k) == v}
        tps = _partitions(parked) | {tp for m in marks.values() for tp in m}
        if not tps:
            return bool(parked)
        ends = self._look(tps)
        seen = []  # the pipelines whose every partition answered (a leaderless one did not)
        for name, mark in marks.items():
            lagging, whole = False, True
            for (t, p), done in mark.items():
                end = ends.get(f"{t}[{p}]")
                if end is None:
                    whole = False
                elif end > done:
                    lagging = True
            if whole:
                seen.append(name)
            if lagging and name not in self._nudged and self.zero is not None:
                self._nudged[name] = mark
                self.zero.nudge(name)
                self.nudges += 1
        if seen and self.zero is not None:
            self.zero.looked(seen, self._zero_every)
        if not parked:
            return False
        ring, stale = due_rings(parked, ends, time.time())
        if stale:
            self._redis.hdel(keys.PARKED, *stale)
            self._parked = None
        pipe = self._redis.pipeline(transaction=False)
        for parked_id in ring:
            if self._rung.get(parked_id) != parked[parked_id]:
                self._rung[parked_id] = parked[parked_id]
                pipe.publish(keys.doorbell(parked_id), "1")
                self.rings += 1
        pipe.execute()
        return True

    def _look(self, tps: set[tuple[str, int]]) -> dict[str, int]:
        if self._looker is None:
            from eventbus.serving._end_offsets import EndOffsets

            self._looker = EndOffsets(self.bootstrap, self.client)
        ends: dict[str, int] = self._looker.ends(tps)
        return ends

    def _close_looker(self) -> None:
        looker, self._looker = self._looker, None
        if looker is not None:
            try:
                looker.close()
            except Exception as e:  # noqa: BLE001 - opened again at the next look
                log.debug("doorbell: closing the look failed (%s)", e)
