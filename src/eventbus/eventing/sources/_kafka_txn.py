"""Exactly once through Kafka transactions (``delivery: {guarantee: exactly_once}``).

Each batch holds the records of one input partition. Its outputs, dead letters and the offset
after its last record are written in one Kafka transaction by the transactional producer of
that partition (``transactional.id`` = ``eventbus-{group}-{topic}-{partition}``): either all
of it becomes visible to ``read_committed`` readers and the group's committed offset moves, or
none of it and the records are consumed again.

Why one producer per input partition (Kafka's EOS v1 fencing), not one per consumer with the
group's generation (KIP-447, EOS v2): aiokafka 0.14 sends ``TxnOffsetCommit`` v0, which carries
no member id or generation, so the group coordinator cannot fence a zombie by its generation.
A stable transactional id per partition fences it instead: the partition's next owner starts
the producer of the same id (``InitProducerId``), which aborts (or lets finish) the zombie's
open transaction and bumps the epoch, so every later send, offset commit or commit of the
zombie fails with ``ProducerFenced``. The new owner reads the committed offsets only after
that (``assign``), so nothing the zombie committed is read again.

Transactions of one partition run one after another (a producer has one open transaction), in
batch order; partitions run concurrently. A batch whose transaction fails aborts; the batches
of its partition behind it are skipped (:class:`TransactionSkipped`) and the partition goes
back to its committed offset (``rewind``), so its records are consumed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs
from eventbus.eventing._txn_context import CURRENT_PRODUCER

__all__ = ["TransactionSkipped", "Transactions", "transactional_id"]

log = logging.getLogger("eventbus.eventing.sources._kafka")

#: Longest a transaction may stay open before the broker aborts it.
TRANSACTION_TIMEOUT_MS = 60_000
#: Longest a batch's transaction may take from its first send to its commit (the steps ran
#: before it began) before it is given up: aborted, its producer replaced, the partition
#: rewound. A producer can wait forever on a broker that died (a send to the dead leader, a
#: request to the dead transaction coordinator); the replacement finds the new ones.
STUCK_S = 20.0
#: Longest an abort or a producer's close may take.
_CLOSE_S = 10.0


class TransactionSkipped(Exception):
    """A batch's transaction aborted, or one before it of its partition did: nothing of it is
    visible and its offsets were not committed; its records are consumed again (by this
    source after a rewind, or by the partition's next owner when fenced)."""

    def __init__(self, partition: str, reason: str, poisons: bool = True) -> None:
        super().__init__(partition, reason, poisons)
        self.partition = partition
        self.reason = reason
        #: False: the batch was fetched while the partition was not (yet) this source's; the
        #: partition's position is put back before it is, so the batches after it go on
        self.poisons = poisons

    def __str__(self) -> str:
        return f"transaction of {self.partition} aborted: {self.reason}"


def transactional_id(group: str, tp: TopicPartition) -> str:
    """The transactional id of input partition ``tp`` in consumer group ``group``: the same in
    every replica, so the partition's next owner fences the one before."""
    return f"eventbus-{group}-{tp.topic}-{tp.partition}"


class Transactions:
    """The transactional producers of a source's assigned partitions and their transactions.

    Args:
        group: the consumer group (its offsets are committed in the transactions).
        bootstrap_servers: the cluster of the source and of every sink.
        client: connection settings (TLS, SASL).
        pipeline: for logs.
        rewind: puts a partition back to its committed offset and :meth:`own` s it again
            (after an abort).
    """

    def __init__(
        self,
        group: str,
        bootstrap_servers: str,
        client: KafkaClientConfig | None,
        pipeline: str,
        rewind: Callable[[TopicPartition], Awaitable[None]],
    ) -> None:
        self._group = group
        self._bootstrap = bootstrap_servers
        self._client = client
        self._pipeline = pipeline
        self._rewind = rewind
        self._producers: dict[TopicPartition, AIOKafkaProducer] = {}
        # per partition: the delivery of its last batch (the next one's transaction waits)
        self._tails: dict[TopicPartition, asyncio.Future[Any]] = {}
        # partitions whose producer fenced the previous owner and whose position was put
        # back to the committed offset after that: only their batches may commit
        self._owned: set[TopicPartition] = set()
        #: aborted transactions (the source's ``txn_aborts`` counter)
        self.aborts = 0
        #: transactions refused because a newer owner fenced the producer (``txn_fenced``)
        self.fenced = 0

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
        self._owned.update(tps)

    def owns(self, tp: TopicPartition) -> bool:
        """Whether a batch of ``tp`` fetched now may commit."""
        return tp in self._owned

    def disown(self, tps: set[TopicPartition]) -> None:
        """Batches of ``tps`` fetched from now on are skipped (a revocation began)."""
        self._owned.difference_update(tps)

    async def release(self, tps: set[TopicPartition]) -> None:
        """Close the producers of revoked partitions (their batches were finished)."""
        for tp in tps:
            self._tails.pop(tp, None)
            self._owned.discard(tp)
            producer = self._producers.pop(tp, None)
            if producer is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.stop(), _CLOSE_S)

    async def close(self) -> None:
        """Close every producer (an open transaction is aborted by the broker or fenced)."""
        await self.release(set(self._producers))

    def chain(
        self, tp: TopicPartition, delivery: asyncio.Future[Any]
    ) -> asyncio.Future[Any] | None:
        """Make ``delivery`` the last of ``tp``; return the one before it (or None)."""
        before = self._tails.get(tp)
        self._tails[tp] = delivery
        return before

    @contextlib.asynccontextmanager
    async def transaction(
        self, offsets: dict[TopicPartition, int], before: asyncio.Future[Any] | None, owned: bool
    ) -> AsyncIterator[None]:
        """One batch's transaction: sends inside the block go through the partition's
        producer; on leaving, the offsets join and it commits, or it aborts on an error.

        Raises:
            TransactionSkipped: the transaction aborted, or the batch before it did.
        """
        (tp,) = offsets
        name = f"{tp.topic}[{tp.partition}]"
        if not owned:
            raise TransactionSkipped(name, "fetched while the partition was not owned", False)
        if before is not None:
            await asyncio.wait([before])
            error = None if before.cancelled() else before.exception()
            if before.cancelled() or getattr(error, "poisons", error is not None):
                raise TransactionSkipped(name, "a batch before it of its partition aborted")
        producer = self._producers.get(tp)
        if producer is None:  # a new one after an abort (the same id)
            producer = await self._start(tp)
        try:
            await producer.begin_transaction()
        except KafkaError as e:
            await self._failed(tp, producer, e)
            raise TransactionSkipped(name, f"{type(e).__name__}: {e}") from e
        token = CURRENT_PRODUCER.set(producer)
        try:
            async with asyncio.timeout(STUCK_S):  # TimeoutError: given up, as any failure
                yield
                await producer.send_offsets_to_transaction(offsets, self._group)
                await producer.commit_transaction()
        except asyncio.CancelledError:
            await self._abort(tp, producer)
            raise
        except Exception as e:
            await self._abort(tp, producer)
            await self._failed(tp, producer, e)
            raise TransactionSkipped(name, f"{type(e).__name__}: {e}") from e
        finally:
            CURRENT_PRODUCER.reset(token)

    async def _start(self, tp: TopicPartition) -> AIOKafkaProducer:
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
        await producer.start()  # InitProducerId: fences the partition's previous producer
        self._producers[tp] = producer
        return producer

    async def _abort(self, tp: TopicPartition, producer: AIOKafkaProducer) -> None:
        self.aborts += 1
        with contextlib.suppress(Exception):  # fenced, or the broker is gone: it aborts itself
            await asyncio.wait_for(producer.abort_transaction(), _CLOSE_S)

    async def _failed(
        self, tp: TopicPartition, producer: AIOKafkaProducer, e: BaseException
    ) -> None:
        """After an abort: a fenced producer is dropped (the partition moved on); otherwise
        the partition goes back to its committed offset and is consumed again.

        A producer that is no longer the partition's (it was released on a revocation, or
        replaced after an earlier abort) says nothing of the current one: it is only closed.
        Disowning or rewinding on its failure would skip the current producer's batches with
        the position left where they ended (their records lost), or rewind under batches
        that then commit (their records twice)."""
        if self._producers.get(tp) is not producer:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), _CLOSE_S)
            return
        if isinstance(e, ProducerFenced):
            self.fenced += 1
            log.warning(
                "kafka source %s: the transactional producer of %s[%d] was fenced (the "
                "partition has a newer owner); its batches are left to it",
                self._pipeline,
                tp.topic,
                tp.partition,
            )
            self._owned.discard(tp)
            await self._drop(tp, producer)
            return
        log.warning(
            "kafka source %s: transaction of %s[%d] aborted (%s: %s); consuming it again from "
            "the committed offset",
            self._pipeline,
            tp.topic,
            tp.partition,
            type(e).__name__,
            e,
        )
        # A producer in an error state cannot begin again: a new one of the same id.
        self._owned.discard(tp)
        await self._drop(tp, producer)
        # the batches chained so far are skipped; what is fetched once the partition is back
        # at its committed offset starts afresh (the rewind owns it again)
        await self._rewind(tp)

    async def _drop(self, tp: TopicPartition, producer: AIOKafkaProducer) -> None:
        if self._producers.get(tp) is producer:
            del self._producers[tp]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), _CLOSE_S)
