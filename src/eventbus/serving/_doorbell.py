"""The doorbell of idle Kafka sources: one watcher rings them when records arrive, so that an
idle replica sends no fetch at all and still takes its first event within tens of ms.

* A replica's idle source (no record for ``IDLE_AFTER_S``) parks: it pauses its partitions,
  records ``{"ends": {"topic[p]": log end it saw}, "at": t}`` under its parked id in
  ``eventbus:parked`` and waits for a message on its channel ``eventbus:doorbell:<id>``
  (:class:`RedisDoorbell`).
* The controller's :class:`Ringer` reads ``eventbus:parked`` every :data:`RING_EVERY_S`; when
  something is parked it sends one ``ListOffsets`` for all parked partitions and publishes to
  the channel of each source whose partition end moved past what it saw. Tansu answers
  ``ListOffsets`` with the last record batch's base offset + 1: any batch that arrives after
  the source's last fetch puts it past the log end that fetch saw, so no arrival is missed.
* What it costs does not grow with idle pipelines: while any source is parked, one
  ``ListOffsets`` per tick, and one Redis read of the parked entries when a source parked (its
  notice) or once every :data:`PARKED_REREAD_S`; with none parked (every pipeline at zero) no tick: the
  ringer waits for a parking source's notice (``eventbus:parked-notice``), looking once a
  second anyway. A parked source costs its consumer group heartbeats and one fetch every
  ``PARK_MAX_S`` (the fallback when no ring comes).

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
from collections.abc import Mapping
from typing import Any

from eventbus._internal import keys
from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs

__all__ = ["RING_EVERY_S", "STALE_S", "RedisDoorbell", "Ringer", "due_rings"]

log = logging.getLogger("eventbus.serving.doorbell")

#: How often the ringer looks at the parked sources' partitions (the first event after
#: idleness waits about half of it, plus one fetch).
RING_EVERY_S = 0.05  # 20 looks a second: ~1% of a core here (~0.6 ms each, most of it aiokafka)
#: A parked entry not refreshed for this long belongs to a replica that died: dropped.
STALE_S = 60.0
#: With nothing parked the ringer waits for a source's notice, looking anyway this often.
IDLE_LOOK_S = 1.0
#: While sources are parked the ringer reads ``eventbus:parked`` again when a parking notice
#: came, and at least this often (an entry's removal sends none): between, it reuses what it
#: read (a ``HGETALL`` was ~40% of a look's CPU with 10 parked sources).
PARKED_REREAD_S = 1.0


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
    """The controller's side: a daemon thread with its own event loop and Kafka client.

    Args:
        redis: a sync Redis client (``decode_responses=True``).
        bootstrap: the stack's Kafka (the parked sources read it).
        client: its connection settings.
    """

    def __init__(self, redis: Any, bootstrap: str, client: KafkaClientConfig | None) -> None:
        self._redis = redis
        self.bootstrap = bootstrap
        self.client = client
        self._consumer: Any = None
        self._rung: dict[str, str] = {}  # parked id -> the entry it was rung for (once each)
        self._parked: dict[str, str] | None = None  # what was read last (None: read again)
        self._parked_at = 0.0  # when (monotonic)
        #: rings sent so far
        self.rings = 0
        self._thread = threading.Thread(target=self._main, name="eventbus-doorbell", daemon=True)

    def start(self) -> None:
        """Start ringing."""
        self._thread.start()

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        notices: Any = None
        while True:
            try:
                if notices is None:  # subscribed for good: a notice while looking waits
                    notices = self._subscribe()
                if notices is not False and _drain_notices(notices, 0.0):
                    self._parked = None  # a source parked: read the entries again
                if await self.tick():
                    await asyncio.sleep(RING_EVERY_S)
                elif notices is not False:  # nothing parked: wait for a source to park
                    await asyncio.to_thread(_drain_notices, notices, IDLE_LOOK_S)
                else:
                    await asyncio.sleep(IDLE_LOOK_S)
            except Exception as e:  # noqa: BLE001 - Redis or Kafka away: next tick
                log.warning("doorbell: a check failed (%s)", e)
                notices = None if notices is not False else False
                await asyncio.sleep(1.0)

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

    async def tick(self) -> bool:
        """Look once: ring the parked sources whose partitions got records. False: nothing
        is parked."""
        now = time.monotonic()
        parked = self._parked
        if parked is None or now - self._parked_at >= PARKED_REREAD_S:
            parked = self._parked = self._redis.hgetall(keys.PARKED)
            self._parked_at = now
        self._rung = {k: v for k, v in self._rung.items() if parked.get(k) == v}
        if not parked:
            self._parked = None  # the next look (after a notice) reads them
            return False
        from aiokafka import TopicPartition

        consumer = await self._client()
        tps = [TopicPartition(t, p) for t, p in sorted(_partitions(parked))]
        # bounded: aiokafka waits for the metadata of a topic deleted meanwhile
        offsets = await asyncio.wait_for(consumer.end_offsets(tps), 5.0) if tps else {}
        ends = {f"{tp.topic}[{tp.partition}]": end for tp, end in offsets.items()}
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

    async def _client(self) -> Any:
        if self._consumer is None:
            from aiokafka import AIOKafkaConsumer

            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                client_id="eventbus-doorbell",
                **kafka_client_kwargs(self.client),
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer
