"""The exactly-once parts of the Kafka source (``delivery: {guarantee: exactly_once}``): a
fetch cut into one batch per input partition sharing one dispatch, each batch delivered in
its partition's transaction (``_kafka_txn``) after the partition's batch before, and the
partition put back to its committed offset after an abort. :class:`KafkaSource` mixes it in.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from eventbus._internal.backoff import Backoff
from eventbus.eventing._outcome import Outcome
from eventbus.eventing._routing import Turn
from eventbus.eventing.sources._kafka_batch import BatchMaker, KafkaBatch
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.eventing.sources._kafka_delivery import Delivery
from eventbus.eventing.sources._kafka_fetch import KafkaFetcher
from eventbus.eventing.sources._kafka_retry import Redispatcher
from eventbus.eventing.sources._kafka_txn import Transactions

__all__ = ["ExactlyOnce"]

log = logging.getLogger("eventbus.eventing.sources._kafka")

#: Longest a partition may stay unowned because its position cannot be put back (the
#: committed offsets unreadable, the producer not started) before the source stops.
TAKE_GIVE_UP_S = 120.0
_TAKE_BACKOFF = Backoff(initial_s=0.2, max_s=5.0)


class ExactlyOnce:
    """The exactly-once batching, delivery and rewind of :class:`KafkaSource`."""

    config: KafkaSourceConfig
    pipeline: str
    _txns: Transactions | None
    _fetcher: KafkaFetcher
    _batches: BatchMaker
    _redispatch: Redispatcher
    _delivery: Delivery
    _queue: collections.deque[KafkaBatch]
    _progress: asyncio.Event
    _stats: dict[str, int]
    _max_in_flight: int
    _fatal: BaseException | None
    _stopping: bool

    async def _deliver(self, batch: KafkaBatch, turn: Turn) -> None:
        raise NotImplementedError  # KafkaSource's

    def _in_flight_limit(self) -> int:
        # exactly_once cuts a fetch into a batch per partition: max_in_flight counts fetches
        consumer = self._fetcher.consumer
        if self._txns is None or consumer is None:
            return self._max_in_flight
        return self._max_in_flight * max(1, len(consumer.assignment()))

    def _enqueue_txn(self, data: dict[TopicPartition, list[Any]]) -> None:
        # exactly_once: one dispatch for the whole fetch, then one batch (one transaction) per
        # input partition, each delivered after its partition's batch before
        assert self._txns is not None
        batches = [b for tp, recs in data.items() if (b := self._batches.make({tp: recs}))]
        events: list[Any] = [e for b in batches for e in b.events]
        shared = asyncio.create_task(self._redispatch(events, batches[0].seq)) if events else None
        start = 0
        for batch in batches:
            self._stats["consumed"] += batch.count
            if batch.events and shared is not None:
                self._stats["batches"] += 1
                end = start + len(batch.events)
                batch.task = asyncio.create_task(_part(shared, start, end))
                start = end
            (tp,) = batch.offsets
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            owned = self._txns.owns(tp)  # fetched from where it may commit
            prior = self._txns.chain(tp, ready)
            turn = self._delivery.reserve()
            batch.delivery = asyncio.create_task(
                self._deliver_txn(batch, turn, prior, ready, owned)
            )
            self._queue.append(batch)
        self._progress.set()

    async def _deliver_txn(
        self,
        batch: KafkaBatch,
        turn: Turn,
        before: asyncio.Future[Any] | None,
        ready: asyncio.Future[None],
        owned: bool,
    ) -> None:
        # exactly_once: the batch's delivery in its partition's transaction, after the
        # partition's batch before; ``ready`` tells the partition's next batch how it ended.
        assert self._txns is not None
        try:
            if batch.task is not None:  # the steps run before the transaction begins
                await asyncio.wait([batch.task])
            async with self._txns.transaction(batch.offsets, before, owned):
                await self._deliver(batch, turn)
        except BaseException as e:
            turn.release()  # nothing of it is visible: the batches after it go on
            if isinstance(e, asyncio.CancelledError):
                ready.cancel()
            else:
                ready.set_exception(e)
                ready.exception()  # retrieved: the partition's next batch may not look
            raise
        ready.set_result(None)

    async def _rewind(self, tp: TopicPartition) -> None:
        # an aborted transaction: the partition goes back to its committed offset; records
        # fetched meanwhile are dropped (the fetcher's generation) and come again
        await self._take({tp}, fence=False)

    async def _take(self, tps: set[TopicPartition], fence: bool = True) -> None:
        """Fence the partitions' previous owners (``fence``), put their positions back to the
        committed offsets, then own them (their batches may commit from then on).

        The partitions are paused meanwhile (nothing of them is fetched until they are owned),
        and a partition is owned only once its position was put back: batches fetched before
        are skipped, so a position left where they ended would lose their records. A failed
        step is tried again (the one backoff policy) while the partitions stay assigned; after
        :data:`TAKE_GIVE_UP_S` the source stops (its replica restarts), never skipping on.
        """
        assert self._txns is not None
        joined = self._fetcher.member
        if joined is None:
            return  # stopped
        member: AIOKafkaConsumer = joined
        live = tps & member.assignment()
        if not live:
            return  # revoked meanwhile: the next owner takes them
        member.pause(*live)  # before any await: no fetch of them from here until owned
        loop = asyncio.get_running_loop()
        give_up = loop.time() + TAKE_GIVE_UP_S
        attempt = 0
        while True:
            try:
                if fence:
                    await self._txns.assign(live)
                self._fetcher.revoked()
                await self._seek_committed(member, live)
                self._fetcher.revoked()  # what a fetch begun before brings is dropped
                self._txns.own(live)
                member.resume(*(live & member.assignment()))
                return
            except (KafkaError, IllegalStateError) as e:
                attempt += 1
                if loop.time() >= give_up:
                    log.error(
                        "kafka source %s: cannot put %s back to the committed offsets for "
                        "%.0f s (%r); stopping (a restart reads them again)",
                        self.pipeline,
                        _names(live),
                        TAKE_GIVE_UP_S,
                        e,
                    )
                    self._fatal = e
                    self._stopping = True
                    self._progress.set()
                    return
                delay = _TAKE_BACKOFF.delay(attempt)
                log.warning(
                    "kafka source %s: cannot put %s back to the committed offsets yet (%r); "
                    "they stay paused, trying again in %.1f s",
                    self.pipeline,
                    _names(live),
                    e,
                    delay,
                )
                await asyncio.sleep(delay)  # the backoff between tries
            if self._fetcher.member is not joined:
                return  # stopped meanwhile
            live &= member.assignment()
            if not live:
                return  # revoked meanwhile: the next owner takes them

    async def _seek_committed(self, consumer: AIOKafkaConsumer, tps: set[TopicPartition]) -> None:
        """Put ``tps`` back to their committed offsets (nothing committed yet: the start, as
        ``start_from`` says).

        Raises:
            KafkaError, IllegalStateError: the committed offsets could not be read or sought.
        """
        committed = await consumer.seek_to_committed(*tps)
        fresh = [tp for tp, off in committed.items() if not off]  # nothing committed yet
        if fresh and self.config.start_from == "earliest":
            await consumer.seek_to_beginning(*fresh)


def _names(tps: set[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps))


async def _part(shared: asyncio.Task[list[Outcome]], start: int, end: int) -> list[Outcome]:
    """One partition's outcomes of a dispatch shared by several batches (exactly_once)."""
    return (await shared)[start:end]
