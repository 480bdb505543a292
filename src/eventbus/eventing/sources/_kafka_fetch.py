"""Fetching and positions of the Kafka source: the consumer, fetch pacing, offset gaps, and the
seek back after a rebalance.

:class:`KafkaFetcher` owns the consumer-group member: it fetches at most once per
``linger_ms`` while records keep coming, long-polls (``idle_fetch_max_wait_ms``) once none
came for :data:`IDLE_AFTER_S`, or with a doorbell parks (fetches nothing until it rings; see
:class:`~eventbus.eventing.sources._kafka_settings.Doorbell`), and drops what it fetched
across a rebalance, putting the partitions it still owns back to their committed offsets.
Its parts: offset gaps (``_kafka_gaps.OffsetGaps``: a partition's records only up to a gap in
their offsets; Tansu stores concurrent producers' batches out of order), the idle waits
(``_kafka_waits.FetchWaits``: park, long poll) and the join bridge (``_kafka_bridge.Bridging``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from eventbus.eventing._broker import gap_wait_s, is_tansu
from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs
from eventbus.eventing._kafka_live_password import follow_password, refresh
from eventbus.eventing.sources._kafka_bridge import BRIDGE_WAIT_S, Bridging, open_bridge
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.eventing.sources._kafka_gaps import OffsetGaps
from eventbus.eventing.sources._kafka_settings import FetchSettings
from eventbus.eventing.sources._kafka_waits import PARK_MAX_S, FetchWaits

__all__ = ["BRIDGE_WAIT_S", "IDLE_AFTER_S", "PARK_MAX_S", "KafkaFetcher"]

# One logger for every part of the Kafka source, as when it was one module.
log = logging.getLogger("eventbus.eventing.sources._kafka")

_GAP_REFETCH_S = 0.005  # between fetches while a partition has a gap
_POLL_MS = 100  # longest getmany() waits while records flow (bounds how fast stop() is seen)

#: A source that fetched no record for this long is idle: its fetches long-poll (or it parks).
IDLE_AFTER_S = 2.0
_AFTER_PARK_MS = 30  # getmany() after a park that was not rung: one or two short fetches
_AFTER_RING_MS = 300  # ... after a ring: records are there, wait for them (a loaded machine)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(
        self,
        on_revoked: Callable[[set[TopicPartition]], Awaitable[None]],
        on_assigned: Callable[[set[TopicPartition]], Awaitable[None]],
    ) -> None:
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._on_assigned(assigned)


class KafkaFetcher(Bridging, FetchWaits):
    """The consumer-group member of a Kafka source: fetches records, paced and gap-free.

    Args:
        config: the source configuration (topics, start position, fetch wait, gap wait).
        settings: batch size, linger and session timeout.
        pipeline: the pipeline name (client id, logs).
        group: the consumer group.
        bootstrap_servers: the broker.
        client: its connection settings (TLS, SASL); None: plaintext.
    """

    def __init__(
        self,
        config: KafkaSourceConfig,
        settings: FetchSettings,
        *,
        pipeline: str,
        group: str,
        bootstrap_servers: str,
        client: KafkaClientConfig | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.settings = settings
        self.pipeline = pipeline
        self.group = group
        self.bootstrap_servers = bootstrap_servers
        # the wait is decided at start() when unset (by the broker: see eventing._broker)
        gap_ms = config.offset_gap_wait_ms or 0
        self.gaps = OffsetGaps(gap_ms / 1000, f"kafka source {pipeline}")
        #: the running consumer; None before :meth:`start` and after :meth:`stop`.
        self.consumer: AIOKafkaConsumer | None = None
        self._linger_s = settings.linger_ms / 1000
        self._next_fetch_at = 0.0
        self._last_records_at = 0.0  # loop time of the last fetch that returned records
        #: whether fetches long-poll now (no record for IDLE_AFTER_S)
        self.idle = False
        self._generation = 0  # bumped on each revocation: fetched records older are dropped
        #: partitions paused while exactly_once puts them back to their committed offsets (a
        #: park does not resume them)
        self.held: set[TopicPartition] = set()
        #: the group member while its start() runs (``consumer`` is set after it)
        self.starting: AIOKafkaConsumer | None = None
        self._unparked = asyncio.Event()  # set by unpark(): a park ends at once
        self._doorbell = settings.doorbell  # None once it failed: long polls instead
        self._bridge = settings.bridge
        #: the group member while a bridge consumer (``self.consumer``) fetches for it
        self._group: AIOKafkaConsumer | None = None
        self._fetching = asyncio.Lock()  # held by a fetch (and a hand-over)
        self._joining: asyncio.Task[None] | None = None  # the member's start beside a bridge
        self._retired: AIOKafkaConsumer | None = None  # the bridge's consumer, handed over
        #: parks so far (each ends on the doorbell, on unpark() or after PARK_MAX_S)
        self.parks = 0
        #: whether the broker is Tansu (decided at start): only there does a waiting fetch
        #: wait its whole fetch_max_wait_ms, so only there is the wait switched while idle
        self._tansu = False

    #: exactly_once (with start_from earliest): batches of a partition fetched before this
    #: source owned it are skipped, so records dropped in a rebalance are fetched again from
    #: the partition's start when nothing was committed yet (not from the dropped ones)
    skips_uncommitted = False

    async def start(
        self,
        on_revoked: Callable[[set[TopicPartition]], Awaitable[None]],
        on_assigned: Callable[[set[TopicPartition]], Awaitable[None]],
        on_bridged: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Join the consumer group; the callbacks run on rebalances (revoked is awaited).

        With a :class:`~eventbus.eventing.sources._kafka_settings.JoinBridge` that this source
        claims, a second consumer takes every partition by assignment at once and fetches
        while the group member joins; ``on_bridged`` is awaited when the member gets its
        partitions (the source finishes what it took, then calls :meth:`hand_over`).

        Raises:
            KafkaError: the broker cannot be reached (the consumer is stopped again).
        """
        self._tansu = await is_tansu(self.bootstrap_servers, self.client)
        self.gaps.wait_s = await gap_wait_s(
            self.config.offset_gap_wait_ms, self.bootstrap_servers, self.client
        )
        consumer = AIOKafkaConsumer(group_id=self.group, **self._consumer_kwargs())
        follow_password(consumer, self.client)  # a rotated SASL password: no restart
        listener = _Listener(on_revoked, self._assigned_hook(on_assigned, on_bridged))
        consumer.subscribe(self.config.topics, listener=listener)
        # idle (long poll, park) only after IDLE_AFTER_S without records from now: not while
        # the group join is still under way
        self._last_records_at = asyncio.get_running_loop().time()
        bridge = None
        if self._bridge is not None and on_bridged is not None and not await self._bridge.claim():
            # another source holds the bridge: join once it handed over (a member that joined
            # meanwhile could fetch, on an assignment of the generation before, partitions
            # the bridge's member got)
            await self._bridge.wait_clear(BRIDGE_WAIT_S)
        elif self._bridge is not None and on_bridged is not None:
            bridge = await open_bridge(
                self.config.topics, self.group, self._consumer_kwargs(), self.client
            )
            if bridge is None:  # a topic has no partitions yet: nothing to bridge
                await self._close_bridge(bridge_of=True)
            else:
                log.info(
                    "kafka source %s: group %r has no live member; consuming %s by assignment "
                    "while the group join runs",
                    self.pipeline,
                    self.group,
                    ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(bridge.assignment())),
                )
                self._group = consumer  # before the join starts: its hook hands over
        if bridge is not None:
            # aiokafka's start() returns once the member joined: the bridge fetches meanwhile
            self.consumer = bridge
            self._joining = asyncio.create_task(
                consumer.start(), name=f"eventbus-{self.group}-join"
            )
            return
        # aiokafka's start() returns once the first assignment is made, while its callback
        # may still run: exactly_once puts the partitions back through this one meanwhile
        self.starting = consumer
        try:
            await consumer.start()
        except (KafkaError, KeyError):
            await consumer.stop()
            raise
        finally:
            self.starting = None
        self.consumer = consumer

    def _consumer_kwargs(self) -> dict[str, Any]:
        session_ms, heartbeat_ms = self.settings.group_timings(
            self.config.session_timeout_ms, self.config.heartbeat_interval_ms
        )
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": f"eventbus-{self.pipeline}",
            "enable_auto_commit": False,
            # records of aborted transactions never reach a step; open transactions hold
            # their partition at the last stable offset until they end
            "isolation_level": "read_committed",
            "auto_offset_reset": self.config.start_from,
            "session_timeout_ms": session_ms,
            "heartbeat_interval_ms": heartbeat_ms,
            "max_poll_records": self.settings.max_batch,
            # Apache Kafka answers a waiting fetch as soon as records arrive: every fetch may
            # long-poll (an idle source costs a fetch per idle wait, a busy one no latency).
            # Tansu holds it for the whole wait: short while busy, switched when idle.
            "fetch_max_wait_ms": self.config.fetch_max_wait_ms
            if self._tansu
            else self.config.idle_fetch_max_wait_ms,
            "max_partition_fetch_bytes": 4 * 1024 * 1024,
            **kafka_client_kwargs(self.client),
        }

    async def stop(self) -> None:
        """Leave the group (idempotent)."""
        consumer, self.consumer = self.consumer, None
        member, self._group = self._group, None
        joining, self._joining = self._joining, None
        if joining is not None:
            joining.cancel()
            await asyncio.gather(joining, return_exceptions=True)
        for c in (consumer, member):
            if c is not None:
                await c.stop()
        await self._close_bridge(bridge_of=member is not None)

    def revoked(self) -> None:
        """Partitions are being revoked: records fetched before are dropped, and the
        partitions' positions go back to the committed offsets."""
        self._generation += 1
        self.gaps.reset()

    async def fetch(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, list[Any]]:
        """Up to ``max_batch`` records, per partition in offset order; {} when none came."""
        refresh(self.client)  # at most once a second: a rotated SASL password's next login
        joining = self._joining
        if joining is not None and joining.done():
            self._joining = None
            joining.result()  # the group member could not start: the source fails
        async with self._fetching:
            if consumer is self._retired:  # the bridge's, handed over meanwhile
                return {}
            return await self._fetch(consumer)

    async def _fetch(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, list[Any]]:
        loop = asyncio.get_running_loop()
        wait = self._next_fetch_at - loop.time()
        if wait > 0:  # records keep coming: let more gather at the broker (see linger_ms)
            await asyncio.sleep(wait)
        generation = self._generation
        poll_ms = self.config.idle_fetch_max_wait_ms if self.idle else _POLL_MS
        if self.idle and self._doorbell is not None:
            rung = await self._park(consumer, self._doorbell)
            if self._doorbell is not None:
                poll_ms = _AFTER_RING_MS if rung else _AFTER_PARK_MS
        data: dict[TopicPartition, list[Any]] = await consumer.getmany(
            timeout_ms=poll_ms, max_records=self.settings.max_batch
        )
        if not data:
            idle_for = loop.time() - self._last_records_at
            if not self.idle and not self.bridging and idle_for >= IDLE_AFTER_S:
                self._set_idle(consumer, True)
            return {}
        self._last_records_at = loop.time()
        if self.idle:
            self._set_idle(consumer, False)
        count = sum(len(recs) for recs in data.values())
        if count < self.settings.max_batch:
            self._next_fetch_at = loop.time() + self._linger_s
        if generation == self._generation and self.gaps.wait_s > 0:
            now = loop.time()
            data, held = self.gaps.take(consumer, data, now)
            if held:  # fetch again from the gap soon, not at once
                self._next_fetch_at = max(self._next_fetch_at, now + _GAP_REFETCH_S)
        if generation != self._generation:
            # A rebalance happened meanwhile: these records are dropped and come again, from
            # us or the partitions' new owner. The rebalance reset our positions to the
            # committed offsets, but records fetched after it moved them on again: put every
            # partition we still own back to its committed offset (everything before it was
            # delivered), or else those records would be skipped.
            assigned = consumer.assignment()
            for tp, recs in data.items():
                if tp in assigned and recs:
                    committed = await consumer.committed(tp)
                    if committed is None and self.skips_uncommitted:
                        # batches before these were skipped, not delivered: from the start
                        await consumer.seek_to_beginning(tp)
                        continue
                    consumer.seek(
                        tp, committed if committed is not None else min(r.offset for r in recs)
                    )
            return {}
        return data

    def log_ends(self) -> dict[str, int]:
        """Per assigned partition (``topic[partition]``, every one, fetched from yet or not):
        the log end the last fetch reported, or -1 before the first fetch of it."""
        consumer = self.consumer
        if consumer is None:
            return {}
        return {
            f"{tp.topic}[{tp.partition}]": (-1 if end is None else end)
            for tp in consumer.assignment()
            for end in (consumer.highwater(tp),)
        }

    def lag(self, committed: Mapping[TopicPartition, int]) -> dict[str, int]:
        """Per assigned partition (``topic[partition]``): the log end the last fetch reported
        minus the ``committed`` offset (records not yet delivered and committed).

        The log end is the high watermark of the latest fetch response, so it is as fresh as
        the last fetch; on the embedded Tansu broker ``end_offsets()`` (ListOffsets) is not
        used because Tansu answers it with the last record batch's base offset + 1.
        """
        consumer = self.consumer
        if consumer is None:
            return {}
        out: dict[str, int] = {}
        for tp in consumer.assignment():
            end = consumer.highwater(tp)
            if end is None:
                continue
            done = committed.get(tp)
            if done is None:
                continue
            out[f"{tp.topic}[{tp.partition}]"] = max(0, end - done)
        return out
