"""Exactly once through Kafka transactions (``delivery: {guarantee: exactly_once}``).

Each batch holds the records of one input partition; its outputs and dead letters are written
by that partition's transactional producer (``transactional.id`` =
``eventbus-{group}-{topic}-{partition}``) in the partition's open transaction, which the
offsets join before it commits: all of it becomes visible to ``read_committed`` readers and
the committed offset moves, or none of it and the records are consumed again.

A partition's transaction stays open across its consecutive batches (as Kafka Streams'
``commit.interval.ms``) and commits when ``commit_interval_s`` elapsed since it began, when it
holds :data:`MAX_RECORDS` records, when no next batch of the partition was fetched (traffic
stopped: nothing is held back), or when the partition is being revoked or the source stops.
A batch counts as committed once its transaction did: one ``EndTxn`` per interval, not batch.

Why one producer per input partition (Kafka's EOS v1 fencing), not one per consumer with the
group's generation (KIP-447, EOS v2): aiokafka 0.14 sends ``TxnOffsetCommit`` v0, which carries
no member id or generation, so the group coordinator cannot fence a zombie by its generation.
A stable transactional id per partition fences it instead: the partition's next owner starts
the producer of the same id (``InitProducerId``), which aborts (or lets finish) the zombie's
open transaction and bumps the epoch, so every later send, offset commit or commit of the
zombie fails with ``ProducerFenced``. The new owner reads the committed offsets only after
that (``assign``), so nothing the zombie committed is read again.

A partition's batches send in batch order (a producer has one open transaction); partitions
run concurrently. When a transaction fails it aborts: every batch in it and every batch of
the partition fetched before the partition was put back to its committed offset (``rewind``)
is skipped (:class:`TransactionSkipped`; the partition's *generation* moved on): their records
are consumed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs
from eventbus.eventing._kafka_live_password import follow_password
from eventbus.eventing._txn_context import CURRENT_PRODUCER

__all__ = ["MAX_RECORDS", "TransactionSkipped", "Transactions", "transactional_id"]

log = logging.getLogger("eventbus.eventing.sources._kafka")

#: Longest a transaction may stay open before the broker aborts it.
TRANSACTION_TIMEOUT_MS = 60_000
#: Longest a transaction may take from its begin to its commit before it is given up (aborted,
#: its producer replaced, the partition rewound): a producer can wait forever on a dead broker
#: (a send to the dead leader, the dead transaction coordinator); a new one finds the new ones.
STUCK_S = 20.0
MAX_RECORDS = 20_000  #: most input records a transaction holds, whatever the interval
_CLOSE_S = 10.0  #: longest an abort or a producer's close may take


class TransactionSkipped(Exception):
    """A batch's transaction aborted, or one before it of its partition did: nothing of it is
    visible and its offsets were not committed; its records are consumed again (by this
    source after a rewind, or by the partition's next owner when fenced)."""

    def __init__(self, partition: str, reason: str, poisons: bool = True) -> None:
        super().__init__(partition, reason, poisons)
        self.partition = partition
        self.reason = reason
        #: False: the batch was fetched while the partition was not (yet) this source's
        self.poisons = poisons

    def __str__(self) -> str:
        return f"transaction of {self.partition} aborted: {self.reason}"


def transactional_id(group: str, tp: TopicPartition) -> str:
    """The transactional id of input partition ``tp`` in consumer group ``group``: the same in
    every replica, so the partition's next owner fences the one before."""
    return f"eventbus-{group}-{tp.topic}-{tp.partition}"


def _name(tp: TopicPartition) -> str:
    return f"{tp.topic}[{tp.partition}]"


@dataclass(eq=False)
class _Open:
    """A partition's open transaction; the batches sent in it wait for ``outcome``."""

    producer: AIOKafkaProducer
    began: float  # loop time
    outcome: asyncio.Future[None]
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    records: int = 0
    batches: int = 0
    timer: asyncio.TimerHandle | None = None


class Transactions:
    """The transactional producers of a source's assigned partitions and their transactions.

    Args:
        group: the consumer group (its offsets are committed in the transactions).
        bootstrap_servers: the cluster of the source and of every sink.
        client: connection settings (TLS, SASL).
        pipeline: for logs.
        rewind: puts a partition back to its committed offset and :meth:`own` s it again
            (after an abort).
        interval_s: how long a partition's transaction stays open for its next batches
            (0: one transaction per batch).
    """

    def __init__(
        self,
        group: str,
        bootstrap_servers: str,
        client: KafkaClientConfig | None,
        pipeline: str,
        rewind: Callable[[TopicPartition], Awaitable[None]],
        interval_s: float = 0.1,
    ) -> None:
        self._group = group
        self._bootstrap = bootstrap_servers
        self._client = client
        self._pipeline = pipeline
        self._rewind = rewind
        self._interval_s = interval_s
        self._producers: dict[TopicPartition, AIOKafkaProducer] = {}
        # per partition: the "sent" signal of its last batch (the next one sends after it)
        self._tails: dict[TopicPartition, asyncio.Future[Any]] = {}
        # partitions whose producer fenced the previous owner and whose position was put
        # back to the committed offset after that: only their batches may commit
        self._owned: set[TopicPartition] = set()
        # per partition: its generation; a batch commits only in the one it was fetched in
        # (an abort or a new ownership starts the next)
        self._gens: dict[TopicPartition, int] = {}
        self._open: dict[TopicPartition, _Open] = {}
        self._locks: dict[TopicPartition, asyncio.Lock] = {}
        self._due_tasks: set[asyncio.Task[None]] = set()
        self.hurry = False  #: True: each transaction commits at the end of its batch (stopping)
        self.waiting = 0  #: batches sent in an open transaction, waiting for its commit
        self.committing = 0  #: those of them whose transaction's commit is under way
        self.aborts = 0  #: aborted transactions (the source's ``txn_aborts`` counter)
        self.fenced = 0  #: transactions refused: a newer owner fenced them (``txn_fenced``)
        self.commits = 0  #: committed transactions (``txn_commits``)

    # -- ownership ---------------------------------------------------------------------------
    async def assign(self, tps: set[TopicPartition]) -> None:
        """Start the producers of newly assigned partitions: each start fences the partition's
        previous owner and ends its open transaction (before the offsets are read). Call
        :meth:`own` once the partitions' positions were put back to the committed offsets."""
        new = [tp for tp in tps if tp not in self._producers]
        await asyncio.gather(*(self._start(tp) for tp in new))

    def own(self, tps: set[TopicPartition]) -> None:
        """Batches of ``tps`` fetched from now on may commit (each partition's chain anew)."""
        for tp in tps:
            self._tails.pop(tp, None)
            self._gens[tp] = self._gens.get(tp, 0) + 1
        self._owned.update(tps)

    def ticket(self, tp: TopicPartition) -> int | None:
        """The generation a batch of ``tp`` fetched now commits in; None: it may not commit."""
        return self._gens.get(tp, 0) if tp in self._owned else None

    def disown(self, tps: set[TopicPartition]) -> None:
        """Batches of ``tps`` fetched from now on are skipped (a revocation began); those in
        flight still commit, each at the end of its batch."""
        self._owned.difference_update(tps)

    def chain(self, tp: TopicPartition, sent: asyncio.Future[Any]) -> asyncio.Future[Any] | None:
        """Make ``sent`` the last of ``tp``; return the one before it (or None)."""
        before = self._tails.get(tp)
        self._tails[tp] = sent
        return before

    async def flush(self, tps: set[TopicPartition] | None = None) -> None:
        """Commit the open transactions of ``tps`` (all: None) now, once their batch sending
        finished (a revocation or a stop: commit what is open, then release)."""
        chosen = set(self._open) if tps is None else tps & set(self._open)
        await asyncio.gather(*(self._commit_if_open(tp, self._open[tp]) for tp in chosen))

    async def release(self, tps: set[TopicPartition]) -> None:
        """Close the producers of revoked partitions (their batches were finished); a
        transaction still open (the revocation did not wait for it) is given up."""
        for tp in tps:
            txn = self._open.get(tp)
            if txn is not None:  # aborted now: read_committed readers wait for no timeout
                self._end(tp, txn, TransactionSkipped(_name(tp), "the partition was revoked"))
                await self._abort(txn.producer)
            self._tails.pop(tp, None)
            self._owned.discard(tp)
            self._gens[tp] = self._gens.get(tp, 0) + 1
            producer = self._producers.pop(tp, None)
            if producer is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.stop(), _CLOSE_S)

    async def close(self) -> None:
        """Close every producer, aborting the open transactions."""
        for task in list(self._due_tasks):
            task.cancel()
        await asyncio.gather(*self._due_tasks, return_exceptions=True)
        await self.release(set(self._producers) | set(self._open))

    # -- a batch -----------------------------------------------------------------------------
    async def send(
        self,
        offsets: dict[TopicPartition, int],
        count: int,
        ticket: int | None,
        before: asyncio.Future[Any] | None,
        sent: asyncio.Future[Any],
        deliver: Callable[[], Awaitable[None]],
    ) -> asyncio.Future[None]:
        """One batch's part: after the partition's batch before (``before``), ``deliver``
        sends its outputs in the partition's open transaction (begun if none is); its offsets
        join it, and it commits now if it is due. Returns the transaction's outcome (a
        TransactionSkipped error when it aborted); ``sent`` is the chain's signal, set by the
        caller.

        Raises:
            TransactionSkipped: the batch may not commit (fetched while the partition was
                not owned, or in a generation an abort ended) or its sending failed (the
                transaction aborted).
        """
        (tp,) = offsets
        name = _name(tp)
        if ticket is None:
            raise TransactionSkipped(name, "fetched while the partition was not owned", False)
        if before is not None:
            await asyncio.wait([before])
        async with self._locks.setdefault(tp, asyncio.Lock()):
            if self._gens.get(tp, 0) != ticket:
                raise TransactionSkipped(name, "a batch before it of its partition aborted")
            txn = self._open.get(tp) or await self._begin(tp)
            token = CURRENT_PRODUCER.set(txn.producer)
            try:
                async with asyncio.timeout_at(txn.began + STUCK_S):  # as any failure
                    await deliver()
                txn.offsets.update(offsets)
                txn.records += count
                txn.batches += 1
                self.waiting += 1
                if self._due(tp, txn, sent):
                    await self._commit(tp, txn)
                elif txn.timer is None:
                    loop = asyncio.get_running_loop()
                    txn.timer = loop.call_at(txn.began + self._interval_s, self._at_due, tp, txn)
            except asyncio.CancelledError:
                self._end(tp, txn, TransactionSkipped(name, "cancelled"))
                await self._abort(txn.producer)
                raise
            except Exception as e:
                await self._failed(tp, txn, e)
                raise TransactionSkipped(name, f"{type(e).__name__}: {e}") from e
            finally:
                CURRENT_PRODUCER.reset(token)
        return txn.outcome

    def _due(self, tp: TopicPartition, txn: _Open, sent: asyncio.Future[Any]) -> bool:
        return (
            asyncio.get_running_loop().time() >= txn.began + self._interval_s
            or txn.records >= MAX_RECORDS
            or self._tails.get(tp) is sent  # no next batch fetched: the partition is idle
            or tp not in self._owned  # revoked, or fenced
            or self.hurry
        )

    def _at_due(self, tp: TopicPartition, txn: _Open) -> None:  # the interval's timer
        txn.timer = None
        task = asyncio.create_task(self._commit_if_open(tp, txn))
        self._due_tasks.add(task)
        task.add_done_callback(self._due_tasks.discard)

    async def _commit_if_open(self, tp: TopicPartition, txn: _Open) -> None:
        async with self._locks.setdefault(tp, asyncio.Lock()):
            if self._open.get(tp) is not txn:
                return  # committed or aborted meanwhile
            try:
                await self._commit(tp, txn)
            except asyncio.CancelledError:
                self._end(tp, txn, TransactionSkipped(_name(tp), "cancelled"))
                await self._abort(txn.producer)
                raise
            except Exception as e:  # noqa: BLE001 - whatever failed, its batches must learn it
                await self._failed(tp, txn, e)

    # -- the transaction ---------------------------------------------------------------------
    async def _begin(self, tp: TopicPartition) -> _Open:
        producer = self._producers.get(tp)
        if producer is None:  # a new one after an abort (the same id)
            producer = await self._start(tp)
        try:
            await producer.begin_transaction()
        except KafkaError as e:
            await self._dropped(tp, producer, e)
            raise TransactionSkipped(_name(tp), f"{type(e).__name__}: {e}") from e
        loop = asyncio.get_running_loop()
        txn = _Open(producer, loop.time(), loop.create_future())
        self._open[tp] = txn
        return txn

    async def _commit(self, tp: TopicPartition, txn: _Open) -> None:
        """Raises: KafkaError, TimeoutError: the commit failed (the caller aborts)."""
        self.committing += txn.batches
        try:
            async with asyncio.timeout_at(txn.began + STUCK_S):
                await txn.producer.send_offsets_to_transaction(txn.offsets, self._group)
                await txn.producer.commit_transaction()
        finally:
            self.committing -= txn.batches
        self.commits += 1
        self._end(tp, txn, None)

    def _end(self, tp: TopicPartition, txn: _Open, error: TransactionSkipped | None) -> None:
        """The transaction ended: its batches learn how; after an abort, the partition's
        batches fetched so far are skipped (its generation moves on)."""
        if self._open.get(tp) is txn:
            del self._open[tp]
        if txn.timer is not None:
            txn.timer.cancel()
            txn.timer = None
        if txn.outcome.done():
            return
        self.waiting -= txn.batches
        if error is None:
            txn.outcome.set_result(None)
            return
        txn.outcome.set_exception(error)
        txn.outcome.exception()  # retrieved: a transaction may have no batch waiting
        self._gens[tp] = self._gens.get(tp, 0) + 1

    async def _failed(self, tp: TopicPartition, txn: _Open, e: BaseException) -> None:
        self._end(tp, txn, TransactionSkipped(_name(tp), f"{type(e).__name__}: {e}"))
        await self._abort(txn.producer)
        await self._dropped(tp, txn.producer, e)

    async def _start(self, tp: TopicPartition) -> AIOKafkaProducer:  # the partition's producer
        producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap,
            transactional_id=transactional_id(self._group, tp),
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            acks="all",
            enable_idempotence=True,
            max_batch_size=512 * 1024,
            max_request_size=1024 * 1024,
            linger_ms=0,
            **kafka_client_kwargs(self._client),
        )
        follow_password(producer, self._client)
        await producer.start()  # InitProducerId: fences the partition's previous producer
        self._producers[tp] = producer
        return producer

    async def _abort(self, producer: AIOKafkaProducer) -> None:
        self.aborts += 1
        with contextlib.suppress(Exception):  # fenced, or the broker is gone: it aborts itself
            await asyncio.wait_for(producer.abort_transaction(), _CLOSE_S)

    async def _dropped(
        self, tp: TopicPartition, producer: AIOKafkaProducer, e: BaseException
    ) -> None:
        """After an abort: a fenced producer is dropped (the partition moved on); otherwise
        the partition goes back to its committed offset and is consumed again. A producer no
        longer the partition's (released, replaced) is only closed: disowning or rewinding on
        its failure would skip or rewind under the current producer's batches."""
        if self._producers.get(tp) is not producer:
            await self._drop(tp, producer)
            return
        self._gens[tp] = self._gens.get(tp, 0) + 1  # what was fetched so far is skipped
        self._owned.discard(tp)
        if isinstance(e, ProducerFenced):
            self.fenced += 1
            log.warning(
                "kafka source %s: the transactional producer of %s was fenced (the partition "
                "has a newer owner); its batches are left to it",
                self._pipeline,
                _name(tp),
            )
            await self._drop(tp, producer)
            return
        log.warning(
            "kafka source %s: transaction of %s aborted (%s: %s); consuming it again from "
            "the committed offset",
            self._pipeline,
            _name(tp),
            type(e).__name__,
            e,
        )
        await self._drop(tp, producer)  # in an error state it cannot begin again: a new one
        await self._rewind(tp)  # back at the committed offset, the partition is owned again

    async def _drop(self, tp: TopicPartition, producer: AIOKafkaProducer) -> None:
        if self._producers.get(tp) is producer:
            del self._producers[tp]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), _CLOSE_S)
