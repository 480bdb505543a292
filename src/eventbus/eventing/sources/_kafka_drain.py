"""Finishing the Kafka source's batches in flight: on :meth:`~Draining.stop`, on a rebalance,
and at a join bridge's hand-over. :class:`~eventbus.eventing.sources._kafka.KafkaSource` mixes
it in.

On a rebalance, the revoked callback (awaited by aiokafka) finishes and commits the batches in
flight before the partitions move, waiting at most ``revoke_timeout_s`` (default: the session
timeout; what is not committed by then is delivered again by the next owner); records fetched
but not yet batched are dropped and fetched again from the committed offsets.
``stop(drain=True)`` stops fetching, finishes the batches in flight, commits and closes. With a
join bridge (``FetchSettings.bridge``: the first member of a group with no live one) the source
fetches by assignment while its member joins; the member's first assignment finishes those
batches as a revocation does, commits them through the member and hands over
(``_kafka_bridge``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition

from eventbus.eventing._outcome import Outcome
from eventbus.eventing.sources._kafka_avro import AvroTranscoder
from eventbus.eventing.sources._kafka_batch import KafkaBatch
from eventbus.eventing.sources._kafka_commit import Committer
from eventbus.eventing.sources._kafka_delivery import Delivery
from eventbus.eventing.sources._kafka_fetch import KafkaFetcher
from eventbus.eventing.sources._kafka_txn import Transactions

__all__ = ["Draining"]

# One logger for every part of the Kafka source, as when it was one module.
log = logging.getLogger("eventbus.eventing.sources._kafka")


class Draining:
    """The stop, rebalance and hand-over callbacks of :class:`KafkaSource`."""

    pipeline: str
    _fetcher: KafkaFetcher
    _commits: Committer
    _delivery: Delivery
    _txns: Transactions | None
    _avro: AvroTranscoder | None
    _queue: collections.deque[KafkaBatch]
    _progress: asyncio.Event
    _stats: dict[str, int]
    _last_dispatch: asyncio.Task[list[Outcome]] | None
    _deliverer: asyncio.Task[None] | None
    _fatal: BaseException | None
    _stopping: bool
    _revoking: bool
    _running: bool
    _run_done: asyncio.Event
    _drain_timeout_s: float
    _revoke_timeout_s: float

    if TYPE_CHECKING:  # ExactlyOnce's (mixed in beside); nothing defined here at run time

        async def _take(self, tps: set[TopicPartition], fence: bool = True) -> None: ...

    async def stop(self, drain: bool = True) -> None:
        """Stop fetching; with ``drain``, finish, deliver and commit the batches in flight.

        Batches not finished within ``drain_timeout_s`` (or at all without ``drain``) are not
        committed: their records are delivered again to whoever consumes the partition next.
        """
        self._stopping = True
        if self._txns is not None:  # what is open commits at the end of its batch
            self._txns.hurry = True
        self._progress.set()
        self._fetcher.unpark()
        if self._running:
            await self._run_done.wait()
        if drain and self._deliverer is not None and self._fatal is None:
            try:
                await asyncio.wait_for(self._wait_drained(), self._drain_timeout_s)
            except TimeoutError:
                log.error(
                    "kafka source %s: %d batches still in flight after %.1f s; stopping without "
                    "committing them (they will be consumed again)",
                    self.pipeline,
                    len(self._queue),
                    self._drain_timeout_s,
                )
        tasks: list[asyncio.Task[Any]] = [b.task for b in self._queue if b.task is not None]
        tasks += [b.delivery for b in self._queue if b.delivery is not None]
        if self._deliverer is not None:
            tasks.append(self._deliverer)
        for task in tasks:
            task.cancel()
        committing = self._commits.cancel()
        if committing is not None:
            tasks.append(committing)
        await asyncio.gather(*tasks, return_exceptions=True)
        self._queue.clear()
        self._last_dispatch = None
        self._deliverer = None
        self._progress.set()  # wakes a revocation callback still waiting for the drain
        await self._fetcher.stop()
        if self._txns is not None:
            await self._txns.close()
        if self._avro is not None:
            await self._avro.aclose()
        await self._delivery.close()

    async def _wait_drained(self, tps: set[TopicPartition] | None = None) -> None:
        if self._txns is not None:  # commit what is open (a revocation: of ``tps``)
            await self._txns.flush(tps)
        while self._queue and self._deliverer is not None and not self._deliverer.done():
            self._progress.clear()
            await self._progress.wait()
        await self._commits.flush()

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self._fetcher.revoked()  # positions go back to the committed offsets
        if self._txns is not None:  # what is fetched from now on is not committed
            self._txns.disown(revoked)
        self._revoking = True
        try:
            if self._queue and self._fatal is None:
                log.info(
                    "kafka source %s: partitions revoked (%s); finishing %d batches in flight",
                    self.pipeline,
                    ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(revoked)),
                    len(self._queue),
                )
                await asyncio.wait_for(self._wait_drained(revoked), self._revoke_timeout_s)
        except TimeoutError:
            # Bounded so that a hung sink or dispatch cannot hold the whole group's rebalance.
            # The batches still in flight finish later, but their commits are refused (the
            # partitions moved) or come after the new owner started from the committed
            # offsets: their events are delivered again by the new owner. At-least-once holds;
            # only duplicates can follow, and dedupe suppresses them where configured.
            self._stats["revoke_timeouts"] += 1
            log.warning(
                "kafka source %s: partitions revoked (%s) but %d batches still in flight after "
                "%.1f s; letting the rebalance go on without them (their events will be "
                "delivered again by the partitions' next owner)",
                self.pipeline,
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(revoked)),
                len(self._queue),
                self._revoke_timeout_s,
            )
        finally:
            if self._txns is not None:
                await self._txns.release(revoked)
            self._revoking = False
            self._progress.set()

    async def _on_bridged(self) -> None:
        # The group member got its partitions: the bridge consumer's batches are finished and
        # committed (as on a revocation), then the member starts from the committed offsets.
        self._revoking = True
        try:
            await self._fetcher.quiet()
            if self._queue and self._fatal is None:
                try:
                    await asyncio.wait_for(self._wait_drained(), self._revoke_timeout_s)
                except TimeoutError:
                    # as on a revocation that timed out: the member reads them again
                    self._stats["revoke_timeouts"] += 1
                    log.warning(
                        "kafka source %s: %d batches of the join bridge still in flight after "
                        "%.1f s; handing over without them (they will be delivered again)",
                        self.pipeline,
                        len(self._queue),
                        self._revoke_timeout_s,
                    )
            try:
                await self._commits.commit_held(self._fetcher.commit_as_member)
            except Exception:  # whatever failed, the member must take over
                # never left bridging (every commit held): the member reads the bridge's
                # batches again from the group's committed offsets (at-least-once)
                log.exception(
                    "kafka source %s: the join bridge's hand-over commit failed; handing over "
                    "without it (its batches are read again by the group member)",
                    self.pipeline,
                )
            await self._fetcher.hand_over()
        finally:
            self._revoking = False
            self._progress.set()

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        if self._txns is not None and assigned:
            # fence the partitions' previous owners (their open transactions end) before the
            # committed offsets are read; records fetched meanwhile are dropped and read again
            await self._take(assigned)
        log.info(
            "kafka source %s: assigned %s",
            self.pipeline,
            ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(assigned)) or "nothing",
        )
