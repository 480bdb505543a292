"""Commits of the Kafka source: a delivered batch's offsets, coalesced, never ahead of delivery.

The source hands a batch to :meth:`Committer.add` only once every event of it was delivered
(outputs and dead letters acknowledged), in batch order. Commits are coalesced: while one
commit round trip runs, the batches delivered meanwhile wait and go in the next commit
together, so a commit never holds up the next delivery. A commit the group refuses (the
partitions moved on in a rebalance) or that fails is skipped: the records are consumed again
by whoever owns the partitions next, or a later commit covers them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from eventbus.eventing.sources._kafka_batch import KafkaBatch
from eventbus.observability._metrics import Histogram

__all__ = ["Committer"]

# One logger for every part of the Kafka source, as when it was one module.
log = logging.getLogger("eventbus.eventing.sources._kafka")


class Committer:
    """Commits delivered batches' offsets, coalesced.

    Args:
        consumer: the running consumer (None once stopped: nothing is committed then).
        pipeline: the pipeline name, for logs.
        stats: the source's counters (``committed`` counts records whose offsets were
            committed).
        latency: end-to-end latency, record timestamp to sink ack: observed once per delivered
            batch (its oldest record's), weighed by the batch's record count.
    """

    def __init__(
        self,
        consumer: Callable[[], AIOKafkaConsumer | None],
        pipeline: str,
        stats: dict[str, int],
        latency: Histogram,
        hold: Callable[[], bool] = lambda: False,
        transactional: bool = False,
    ) -> None:
        # exactly_once: the offsets were committed in the batch's transaction already
        self._transactional = transactional
        self._consumer = consumer
        # while true (a join bridge fetches: the group takes no commit from it once its member
        # joined), delivered batches wait for commit_held()
        self._hold = hold
        self._pipeline = pipeline
        self._stats = stats
        self._latency = latency
        #: the last offsets committed, per partition (for the lag).
        self.committed: dict[TopicPartition, int] = {}
        # Delivered batches whose offsets are not committed yet, and the one commit running.
        self._to_commit: list[KafkaBatch] = []
        self._task: asyncio.Task[None] | None = None

    def add(self, batch: KafkaBatch) -> None:
        """Queue a delivered batch's offsets (batches in delivery order)."""
        if batch.oldest_ms:
            self._latency.observe(max(0.0, time.time() - batch.oldest_ms / 1000), batch.count)
        if self._transactional:
            self.committed.update(batch.offsets)
            self._stats["committed"] += batch.count
            return
        self._to_commit.append(batch)
        if (self._task is None or self._task.done()) and not self._hold():
            self._task = asyncio.create_task(self._loop())

    async def flush(self) -> None:
        """Wait until every delivered batch's offsets were committed (or given up); while
        held, only the commit running."""
        while (self._to_commit and not self._hold()) or (
            self._task is not None and not self._task.done()
        ):
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._loop())
            await asyncio.shield(self._task)

    async def commit_held(
        self, commit: Callable[[dict[TopicPartition, int]], Awaitable[None]]
    ) -> None:
        """Commit every delivered batch waiting, all partitions, with ``commit`` (the join
        bridge's hand-over: its group member commits what the bridge consumer delivered)."""
        if self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        batches, self._to_commit = self._to_commit, []
        if not batches:
            return
        offsets: dict[TopicPartition, int] = {}
        for batch in batches:
            offsets.update(batch.offsets)
        try:
            await commit(offsets)
        except KafkaError as e:
            # the records are consumed again from the older commits (at-least-once)
            log.warning("kafka source %s: the join bridge's commit failed: %r", self._pipeline, e)
            return
        self.committed.update(offsets)
        for batch in batches:
            self._stats["committed"] += batch.count

    def cancel(self) -> asyncio.Task[None] | None:
        """Forget the batches not committed yet; return the commit running, cancelled."""
        task, self._task = self._task, None
        self._to_commit.clear()
        if task is not None:
            task.cancel()
        return task

    async def _loop(self) -> None:
        while self._to_commit and not self._hold():
            batches, self._to_commit = self._to_commit, []
            await self._commit(batches)

    async def _commit(self, batches: list[KafkaBatch]) -> None:
        consumer = self._consumer()
        if consumer is None:
            return
        assigned = consumer.assignment()
        merged: dict[TopicPartition, int] = {}
        for batch in batches:  # in delivery order: later offsets win
            merged.update(batch.offsets)
        offsets = {tp: off for tp, off in merged.items() if tp in assigned}
        if not offsets:
            return
        seqs = f"{batches[0].seq}-{batches[-1].seq}" if len(batches) > 1 else str(batches[0].seq)
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as e:
            # The group moved on: the partitions' next owner consumes these records again.
            log.warning(
                "kafka source %s: commit of batches %s skipped after a rebalance: %s",
                self._pipeline,
                seqs,
                e,
            )
            return
        except KafkaError as e:
            # A later commit covers these offsets; at worst the records are consumed again.
            log.warning("kafka source %s: commit of batches %s failed: %r", self._pipeline, seqs, e)
            return
        self.committed.update(offsets)
        for batch in batches:
            if all(tp in offsets for tp in batch.offsets):
                self._stats["committed"] += batch.count
            else:
                self._stats["committed"] += _count_in(batch, offsets)


def _count_in(batch: KafkaBatch, offsets: dict[TopicPartition, int]) -> int:
    # Only some partitions were still assigned: count the batch's records of those.
    kept = {(tp.topic, tp.partition) for tp in offsets}
    decoded = sum(1 for r in batch.records if (r.topic, r.partition) in kept)
    undecodable = sum(
        1
        for event, _ in batch.dead
        if (event.attributes["ebtopic"], event.attributes["ebpartition"]) in kept
    )
    return decoded + undecodable
