"""Fetching and positions of the Kafka source: the consumer, fetch pacing, offset gaps, and the
seek back after a rebalance.

* :class:`OffsetGaps` takes a partition's records only up to a gap in their offsets and seeks
  back to it (Tansu stores concurrent producers' batches out of order).
* :class:`KafkaFetcher` owns the consumer-group member: it fetches at most once per
  ``linger_ms`` while records keep coming, long-polls (``idle_fetch_max_wait_ms``) once none
  came for :data:`IDLE_AFTER_S`, or with a doorbell parks (fetches nothing until it rings; see
  :class:`~eventbus.eventing.sources._kafka_settings.Doorbell`), and drops what it fetched across a rebalance, putting the
  partitions it still owns back to their committed offsets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from eventbus.eventing._aiokafka_adapter import quiet_fetch_routine, set_fetch_wait
from eventbus.eventing._broker import gap_wait_s, is_tansu
from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs
from eventbus.eventing.sources._kafka_bridge import open_bridge
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.eventing.sources._kafka_settings import Doorbell, FetchSettings

__all__ = ["BRIDGE_WAIT_S", "IDLE_AFTER_S", "PARK_MAX_S", "KafkaFetcher", "OffsetGaps"]

# One logger for every part of the Kafka source, as when it was one module.
log = logging.getLogger("eventbus.eventing.sources._kafka")

_GAP_REFETCH_S = 0.005  # between fetches while a partition has a gap
_POLL_MS = 100  # longest getmany() waits while records flow (bounds how fast stop() is seen)

#: A source that fetched no record for this long is idle: its fetches long-poll (or it parks).
IDLE_AFTER_S = 2.0
#: A parked source fetches once anyway after this long without its doorbell ringing (the
#: watcher may be away: a controller restart; the restarted ringer reads the parked entries
#: from Redis and rings them, so this bounds only a ringer that stays away), then parks again
#: and refreshes its parked entry (older than the doorbell's ``STALE_S``, 60 s, it is dropped).
#: Each park costs a fetch or two and a Redis round trip: 5 s made 10 idle pipelines send ~6
#: requests a second to the broker; 20 s, ~1.5.
PARK_MAX_S = 20.0
_AFTER_PARK_MS = 30  # getmany() after a park that was not rung: one or two short fetches
_AFTER_RING_MS = 300  # ... after a ring: records are there, wait for them (a loaded machine)
#: Longest a new group member waits, in its assignment, for another source's join bridge.
BRIDGE_WAIT_S = 30.0


class OffsetGaps:
    """Takes each partition's fetched records only up to the first gap in their offsets, and
    seeks back to the gap so that it is fetched again.

    On Tansu a batch's offsets are reserved before the batch is stored, so while two
    producers write one partition a fetch can return a later batch before an earlier one
    exists: a consumer that took it would skip the earlier batch for good. A gap still there
    after ``wait_s`` is taken as real and passed, with a warning. On Apache Kafka every gap is
    real (transaction markers, aborted records, compaction) and ``wait_s`` is 0: nothing is
    held (:func:`eventbus.eventing._broker.gap_wait_s` decides).

    Args:
        wait_s: how long a gap is waited for (0: gaps are passed at once).
        name: who consumes, for the warning.
    """

    def __init__(self, wait_s: float, name: str) -> None:
        self.wait_s = wait_s
        self.name = name
        self._expected: dict[TopicPartition, int] = {}  # next offset, per partition
        self._since: dict[TopicPartition, tuple[int, float]] = {}  # missing offset, first seen
        #: fetches whose records were cut at a gap and fetched again (0 on Apache Kafka)
        self.holds = 0

    def reset(self) -> None:
        """Forget the partitions' positions (after a rebalance or a seek elsewhere)."""
        self._expected.clear()
        self._since.clear()

    def take(
        self, consumer: Any, data: dict[TopicPartition, list[Any]], now: float
    ) -> tuple[dict[TopicPartition, list[Any]], bool]:
        """The records to take now, and whether some partition is held at a gap."""
        if self.wait_s <= 0:  # every gap is real (Apache Kafka): nothing to look at
            return data, False
        out: dict[TopicPartition, list[Any]] = {}
        held = False
        for tp, recs in data.items():
            if not recs:
                continue
            expected = self._expected.get(tp)
            cut = None
            first, last = recs[0].offset, recs[-1].offset
            if (expected is None or first <= expected) and last - first == len(recs) - 1:
                expected = last + 1  # the usual case: no gap (offsets only increase)
            else:
                for i, r in enumerate(recs):
                    if expected is not None and r.offset > expected:
                        cut = i
                        break
                    expected = r.offset + 1
            if cut is None:
                self._since.pop(tp, None)
            else:
                assert expected is not None
                since = self._since.get(tp)
                if since is None or since[0] != expected:
                    since = self._since[tp] = (expected, now)
                if now - since[1] < self.wait_s:
                    recs = recs[:cut]
                    consumer.seek(tp, expected)
                    held = True
                    self.holds += 1
                else:
                    log.warning(
                        "%s: %s[%d] has no records at offsets %d-%d after %.1f s; passing them "
                        "(a compacted or transactional topic? set offset_gap_wait_ms: 0 for it)",
                        self.name,
                        tp.topic,
                        tp.partition,
                        expected,
                        recs[cut].offset - 1,
                        now - since[1],
                    )
                    del self._since[tp]
            if recs:
                out[tp] = recs
                self._expected[tp] = recs[-1].offset + 1
        return out, held


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


class KafkaFetcher:
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
            bridge = await open_bridge(self.config.topics, self.group, self._consumer_kwargs())
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
        try:
            await consumer.start()
        except (KafkaError, KeyError):
            await consumer.stop()
            raise
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

    def _assigned_hook(
        self,
        on_assigned: Callable[[set[TopicPartition]], Awaitable[None]],
        on_bridged: Callable[[], Awaitable[None]] | None,
    ) -> Callable[[set[TopicPartition]], Awaitable[None]]:
        async def assigned(tps: set[TopicPartition]) -> None:
            if self._group is not None and on_bridged is not None:
                await on_bridged()  # the member has its partitions: the bridge hands over
            await on_assigned(tps)

        return assigned

    @property
    def bridging(self) -> bool:
        """Whether a bridge consumer fetches while the group member joins."""
        return self._group is not None

    async def quiet(self) -> None:
        """Wait until no fetch is in progress."""
        async with self._fetching:
            pass

    async def commit_as_member(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` (what the bridge consumer delivered) as the group member, through
        its public ``commit()``: the group takes commits only from its members once it has
        one. The member owns every partition the bridge read (it is the group's only member:
        the others wait for the bridge's release); a partition it does not own (a member that
        joined after :data:`BRIDGE_WAIT_S`) is left to its owner, who reads it again from the
        older commit (at-least-once), with a warning.

        Raises:
            KafkaError: the commit failed.
        """
        member = self._group
        if member is None or not offsets:
            return
        owned = member.assignment()
        mine = {tp: offset for tp, offset in offsets.items() if tp in owned}
        if len(mine) < len(offsets):
            log.warning(
                "kafka source %s: the join bridge read %s, which its group member does not own; "
                "their owner reads them again from the older commit",
                self.pipeline,
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(set(offsets) - owned)),
            )
        if mine:
            await member.commit(mine)

    async def hand_over(self) -> None:
        """The group member takes over from the bridge consumer (whose batches the source
        delivered and committed): it starts from the committed offsets; the bridge is
        released."""
        member = self._group
        if member is None:
            return
        async with self._fetching:
            bridge, self.consumer, self._group = self.consumer, member, None
            self._retired = bridge
            self._generation += 1
            self.gaps.reset()
            self.idle = False
            self._last_records_at = asyncio.get_running_loop().time()
        try:
            if bridge is not None:
                await bridge.stop()
            assigned = member.assignment()
            if assigned:  # failing, the member starts from what it read at its assignment
                await member.seek_to_committed(*assigned)
        finally:
            await self._close_bridge(bridge_of=True)
        log.info("kafka source %s: the group member took over from the bridge", self.pipeline)

    async def _close_bridge(self, *, bridge_of: bool) -> None:
        if bridge_of and self._bridge is not None:
            try:
                await self._bridge.release()
            except Exception as e:  # noqa: BLE001 - it expires by itself
                log.warning(
                    "kafka source %s: releasing the join bridge failed: %s", self.pipeline, e
                )

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

    def unpark(self) -> None:
        """End a park now (the source stops); later parks are not affected."""
        self._unparked.set()

    async def _park(self, consumer: AIOKafkaConsumer, doorbell: Doorbell) -> bool:
        """Idle with a doorbell: pause every partition (no fetch goes to the broker) until the
        doorbell rings, :meth:`unpark` is called or :data:`PARK_MAX_S` passed; then resume.
        Whether it rang. A doorbell that fails (its Redis refuses pub/sub: an ACL without
        channels, a cluster) is dropped for good: the source long-polls from then on."""
        parts = consumer.assignment()
        if not parts or self._unparked.is_set():
            return False
        self.parks += 1
        consumer.pause(*parts)
        seen = {f"{tp.topic}[{tp.partition}]": consumer.highwater(tp) for tp in parts}
        ends = {k: -1 if end is None else end for k, end in seen.items()}
        rung = asyncio.ensure_future(doorbell.wait(ends))
        unparked = asyncio.ensure_future(self._unparked.wait())
        # aiokafka's fetch routine otherwise wakes every 0.2 s to find nothing to fetch
        with quiet_fetch_routine(consumer, PARK_MAX_S):
            try:
                await asyncio.wait(
                    {rung, unparked}, timeout=PARK_MAX_S, return_when="FIRST_COMPLETED"
                )
            finally:
                for task in (rung, unparked):
                    task.cancel()
                await asyncio.gather(rung, unparked, return_exceptions=True)
                owned = parts & consumer.assignment()  # a rebalance may have moved some
                if owned:
                    consumer.resume(*owned)  # wakes the fetch routine at once
        if rung.done() and not rung.cancelled() and rung.exception() is not None:
            log.warning(
                "kafka source %s: its doorbell failed (%s: %s); long-polling instead",
                self.pipeline,
                type(rung.exception()).__name__,
                rung.exception(),
            )
            self._doorbell = None
            self._set_idle(consumer, True)
            return False
        return rung.done() and not rung.cancelled()

    def _set_idle(self, consumer: AIOKafkaConsumer, idle: bool) -> None:
        """Switch the fetch requests between the long poll (idle) and the low-latency wait.

        An idle source that sent a fetch every ``fetch_max_wait_ms`` (10 ms) cost ~6% of a
        core in the replica and ~4.5% in the broker; a long poll costs a fetch every
        ``idle_fetch_max_wait_ms``. aiokafka reads the wait when it builds each fetch request,
        so the next request after the first records is short again. A broker that answers a
        waiting fetch when data arrives (Kafka) adds no latency; one that holds it for the
        whole wait (Tansu) delays the first record after idleness by up to the idle wait.
        """
        self.idle = idle
        long_poll = idle and self._doorbell is None  # parked sources do not fetch
        wait = self.config.idle_fetch_max_wait_ms if long_poll else self.config.fetch_max_wait_ms
        if not self._tansu:  # every fetch long-polls from the start (see _consumer_kwargs)
            return
        set_fetch_wait(consumer, wait)
        log.debug(
            "kafka source %s: %s (fetch wait %d ms)",
            self.pipeline,
            "idle" if idle else "busy",
            wait,
        )

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
