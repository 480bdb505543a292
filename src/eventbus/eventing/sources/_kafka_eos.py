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

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from eventbus._internal.backoff import Backoff
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing._outcome import Outcome
from eventbus.eventing._routing import Turn
from eventbus.eventing.sources._kafka_batch import BatchMaker, KafkaBatch
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.eventing.sources._kafka_delivery import Delivery
from eventbus.eventing.sources._kafka_fetch import KafkaFetcher
from eventbus.eventing.sources._kafka_retry import Redispatcher
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy
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
    _in_order: bool
    _last_dispatch: asyncio.Task[list[Outcome]] | None
    _fatal: BaseException | None
    _stopping: bool

    group: str
    bootstrap_servers: str
    client: KafkaClientConfig | None

    async def _deliver(self, batch: KafkaBatch, turn: Turn) -> None:
        raise NotImplementedError  # KafkaSource's

    def _transactions(self, delivery: DeliveryPolicy) -> Transactions | None:
        if not delivery.exactly_once:
            return None
        return Transactions(
            self.group,
            self.bootstrap_servers,
            self.client,
            self.pipeline,
            self._rewind,
            delivery.commit_interval_s,
        )

    def _txn_stats(self) -> dict[str, int]:
        txns = self._txns
        return {
            "txn_aborts": txns.aborts if txns is not None else 0,
            "txn_fenced": txns.fenced if txns is not None else 0,
            "txn_commits": txns.commits if txns is not None else 0,
            "txn_waiting": txns.waiting if txns is not None else 0,
            "txn_committing": txns.committing if txns is not None else 0,
        }

    def _in_flight_limit(self) -> int:
        # exactly_once cuts a fetch into a batch per partition: max_in_flight counts fetches;
        # batches sent and waiting for their transaction's commit do not count
        consumer = self._fetcher.consumer
        if self._txns is None or consumer is None:
            return self._max_in_flight
        return self._max_in_flight * max(1, len(consumer.assignment())) + self._txns.waiting

    def _enqueue_txn(self, data: dict[TopicPartition, list[Any]]) -> None:
        # exactly_once: one dispatch for the whole fetch, then one batch per input partition,
        # each sent after its partition's batch before, in the partition's open transaction
        assert self._txns is not None
        batches = [b for tp, recs in data.items() if (b := self._batches.make({tp: recs}))]
        events: list[Any] = [e for b in batches for e in b.events]
        shared = None
        if events and self._in_order:
            # a join's or aggregate's state in event order: while the fetch before is being
            # retried (Redis away), this one waits (see FetchSettings.in_order)
            shared = asyncio.create_task(
                self._redispatch.after(self._last_dispatch, events, batches[0].seq)
            )
            self._last_dispatch = shared
        elif events:
            shared = asyncio.create_task(self._redispatch(events, batches[0].seq))
        start = 0
        for batch in batches:
            self._stats["consumed"] += batch.count
            if batch.events and shared is not None:
                self._stats["batches"] += 1
                end = start + len(batch.events)
                batch.task = asyncio.create_task(_part(shared, start, end))
                start = end
            (tp,) = batch.offsets
            sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            ticket = self._txns.ticket(tp)  # fetched from where it may commit
            prior = self._txns.chain(tp, sent)
            turn = self._delivery.reserve()
            batch.delivery = asyncio.create_task(
                self._deliver_txn(batch, turn, prior, sent, ticket)
            )
            self._queue.append(batch)
        self._progress.set()

    async def _deliver_txn(
        self,
        batch: KafkaBatch,
        turn: Turn,
        before: asyncio.Future[Any] | None,
        sent: asyncio.Future[None],
        ticket: int | None,
    ) -> None:
        # exactly_once: the batch's outputs sent in its partition's open transaction, after
        # the partition's batch before (``sent`` tells the next one it may go on); done once
        # the transaction committed (TransactionSkipped: it aborted)
        assert self._txns is not None
        try:
            if batch.task is not None:  # the steps run before the batch joins a transaction
                await asyncio.wait([batch.task])
            outcome = await self._txns.send(
                batch.offsets,
                batch.count,
                ticket,
                before,
                sent,
                lambda: self._deliver(batch, turn),
            )
        except BaseException:
            turn.release()  # nothing of it is visible: the batches after it go on
            raise
        finally:
            if not sent.done():
                sent.set_result(None)
        await asyncio.shield(outcome)

    async def _rewind(self, tp: TopicPartition) -> None:
        # an aborted transaction: the partition goes back to its committed offset; records
        # fetched meanwhile are dropped (the fetcher's generation) and come again
        await self._take({tp}, fence=False)

    async def _take(self, tps: set[TopicPartition], fence: bool = True) -> None:
        """Fence the partitions' previous owners (``fence``), put their positions back to the
        committed offsets, then own them (their batches may commit from then on).

        A partition is owned only once its position was put back: batches fetched before are
        skipped, so a position left where they ended would lose their records. A failed step
        is tried again (the one backoff policy) while the partitions stay assigned; after
        :data:`TAKE_GIVE_UP_S` the source stops (its replica restarts), never skipping on.
        """
        assert self._txns is not None
        # paused meanwhile: a fetch that ended after the seek and before the partitions were
        # owned would be skipped with the position past it, and its records lost
        held = self._hold(tps)
        try:
            await self._take_held(tps, fence)
        finally:
            self._fetcher.held -= held
            consumer = self._fetcher.consumer or self._fetcher.starting
            if consumer is not None and (back := held & consumer.assignment()):
                consumer.resume(*back)

    def _hold(self, tps: set[TopicPartition]) -> set[TopicPartition]:
        consumer = self._fetcher.consumer or self._fetcher.starting
        if consumer is None:
            return set()
        held: set[TopicPartition] = (tps & consumer.assignment()) - self._fetcher.held
        if held:
            consumer.pause(*held)
            self._fetcher.held |= held
        return held

    async def _take_held(self, tps: set[TopicPartition], fence: bool) -> None:
        assert self._txns is not None
        loop = asyncio.get_running_loop()
        give_up = loop.time() + TAKE_GIVE_UP_S
        attempt = 0
        while True:
            consumer = self._fetcher.consumer or self._fetcher.starting
            live = tps if consumer is None else tps & consumer.assignment()
            if not live:
                return  # revoked meanwhile: the next owner takes them
            try:
                if fence:
                    await self._txns.assign(live)
                self._fetcher.revoked()
                await self._seek_committed(live)
                self._fetcher.revoked()  # what a fetch begun before brings is dropped
                self._txns.own(live)
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
                    "their batches are skipped until it succeeds, trying again in %.1f s",
                    self.pipeline,
                    _names(live),
                    e,
                    delay,
                )
                await asyncio.sleep(delay)  # the backoff between tries

    async def _seek_committed(self, tps: set[TopicPartition]) -> None:
        """Raises:
        KafkaError, IllegalStateError: the committed offsets could not be read or sought."""
        consumer = self._fetcher.consumer or self._fetcher.starting
        if consumer is None:  # the group member is still starting: nothing was fetched yet
            log.info("kafka source %s: %s taken before any fetch", self.pipeline, _names(tps))
            return
        tps = tps & consumer.assignment()
        # (nothing committed yet: from the start, as start_from says)
        committed = await consumer.seek_to_committed(*tps) if tps else {}
        fresh = [tp for tp, off in committed.items() if not off]  # nothing committed yet
        if fresh and self.config.start_from == "earliest":
            await consumer.seek_to_beginning(*fresh)
        log.info(
            "kafka source %s: %s put back to the committed offsets %s",
            self.pipeline,
            _names(tps),
            {f"{tp.topic}[{tp.partition}]": off for tp, off in committed.items()},
        )


def _names(tps: set[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps))


async def _part(shared: asyncio.Task[list[Outcome]], start: int, end: int) -> list[Outcome]:
    """One partition's outcomes of a dispatch shared by several batches (exactly_once)."""
    return (await shared)[start:end]
