"""The Kafka source: a consumer-group member that feeds micro-batches to a dispatch callable.

Delivery, per the architecture's contract (at-least-once, per-partition order):

1. fetch up to ``max_batch`` records, at most once per ``linger_ms`` while records keep coming;
   a partition's records are taken only up to a gap in its offsets, which is fetched again
   until it fills (Tansu stores concurrent producers' batches out of order; see
   ``offset_gap_wait_ms``);
2. decode each record into a CloudEvent (Avro values to JSON first, ``_kafka_avro``); an
   undecodable record is logged, counted and dead-lettered (raw value as bytes data, the error
   in extension attributes); it never blocks its batch-mates;
3. call ``dispatch(events)`` once per batch, up to ``max_in_flight`` batches concurrently; a
   dispatch that raises (a Ray replica died, say) is retried with capped exponential backoff;
   with ``in_order`` (steps whose state depends on the order of events: joins, aggregates)
   the batches after one whose dispatch is being retried wait for it (retries included);
4. strictly in batch order: send the outputs to the sink and the failures to the dead-letter
   sink, wait for both to acknowledge, then commit ``offset + 1`` per partition. A sink that
   does not acknowledge is retried the same way; an output the sink cannot encode (not a
   CloudEvent, data not JSON) dead-letters its input event with ``ebstep: sink``.

The parts, one module each: fetching and positions (``_kafka_fetch``), retry scheduling
(``_kafka_retry``), delivery to the sinks (``_kafka_delivery``), commits (``_kafka_commit``),
stop and rebalances (``_kafka_drain``) and exactly-once (``_kafka_eos``); :class:`KafkaSource`
composes them and drives the loop.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from contextlib import aclosing
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from eventbus.errors import ConfigError
from eventbus.eventing._kafka_acl import check_topic_access
from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_connect_error
from eventbus.eventing._kafka_live_password import login_stats
from eventbus.eventing._outcome import Dispatch, Outcome
from eventbus.eventing._routing import Turn
from eventbus.eventing.sources._base import Source
from eventbus.eventing.sources._kafka_avro import AvroTranscoder
from eventbus.eventing.sources._kafka_batch import BatchMaker, KafkaBatch
from eventbus.eventing.sources._kafka_commit import Committer
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.eventing.sources._kafka_delivery import DECODE_ERROR_TYPE, Delivery
from eventbus.eventing.sources._kafka_drain import Draining
from eventbus.eventing.sources._kafka_eos import ExactlyOnce
from eventbus.eventing.sources._kafka_fetch import KafkaFetcher
from eventbus.eventing.sources._kafka_retry import EventRetries, Redispatcher
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy, FetchSettings, SourceSinks
from eventbus.eventing.sources._kafka_txn import TransactionSkipped
from eventbus.observability._metrics import LATENCY_BOUNDS_S, Histogram
from eventbus.registry import sources

__all__ = [
    "DECODE_ERROR_TYPE",
    "DeliveryPolicy",
    "FetchSettings",
    "KafkaSource",
    "KafkaSourceConfig",
    "SourceSinks",
]

log = logging.getLogger(__name__)

# fmt: off
_STAT_NAMES = (
    "consumed", "decode_errors", "batches", "outputs", "dropped", "failed", "dead_lettered",
    "committed", "in_flight", "dispatch_retries", "retries", "duplicates", "unrouted",
    # why events were dead-lettered or lost, beyond a step's failure (see _kafka_errors)
    "poison", "too_large", "dead_letters_truncated", "dead_letters_lost", "revoke_timeouts",
    # exactly_once: batches whose transaction aborted (or came after one that did)
    "txn_skipped",
)
# fmt: on


class KafkaSource(Draining, ExactlyOnce, Source):
    """Consumes Kafka topics as a consumer-group member and runs micro-batches through dispatch.

    The source owns its sinks' lifecycle: :meth:`start` starts them, :meth:`stop` stops them.

    Args:
        config: the source configuration (pipeline YAML).
        pipeline: the pipeline name (default group ``eventbus-{pipeline}``, dead-letter
            attribute ``ebpipeline``, logs).
        bootstrap_servers: the runtime's default broker, used when the config names none.
        dispatch: a batch of events in, one outcome per event out.
        sinks: where outputs go, and failed and undecodable events.
        fetch: batch size, linger, batches in flight, session timeout, where records are
            decoded (default :class:`FetchSettings`).
        delivery: event retries, dedupe, and the backoff of failed dispatches and unacknowledged
            sends (default :class:`DeliveryPolicy`: no retries, no dedupe).
        client: the runtime's connection settings (TLS, SASL), used when the config has no
            ``client`` of its own; None: plaintext.

    Raises:
        ValueError: ``max_batch`` or ``max_in_flight`` below 1, or ``linger_ms`` below 0.

    Example:
        >>> async def dispatch(events):
        ...     return [[e] for e in events]
        >>> source = KafkaSource(KafkaSourceConfig(topic="in"), pipeline="demo",
        ...                      bootstrap_servers="127.0.0.1:9092", dispatch=dispatch,
        ...                      sinks=SourceSinks(sink))   # doctest: +SKIP
        >>> # await source.start(); task = asyncio.create_task(source.run()); ...
        >>> # await source.stop()
    """

    def __init__(
        self,
        config: KafkaSourceConfig,
        *,
        pipeline: str,
        bootstrap_servers: str,
        dispatch: Dispatch,
        sinks: SourceSinks,
        fetch: FetchSettings | None = None,
        delivery: DeliveryPolicy | None = None,
        client: KafkaClientConfig | None = None,
    ) -> None:
        fetch = fetch if fetch is not None else FetchSettings()
        delivery = delivery if delivery is not None else DeliveryPolicy()
        if fetch.max_batch < 1 or fetch.max_in_flight < 1 or fetch.linger_ms < 0:
            msg = (
                f"kafka source of pipeline {pipeline!r}: max_batch={fetch.max_batch}, "
                f"max_in_flight={fetch.max_in_flight}, linger_ms={fetch.linger_ms}; max_batch "
                "and max_in_flight must be >= 1 and linger_ms >= 0"
            )
            raise ValueError(msg)
        # the group's timings: these settings', else the source config's (YAML)
        session_ms, heartbeat_ms = fetch.group_timings(
            config.session_timeout_ms, config.heartbeat_interval_ms
        )
        fetch = dataclasses.replace(
            fetch, session_timeout_ms=session_ms, heartbeat_interval_ms=heartbeat_ms
        )
        if not 0 < heartbeat_ms < session_ms:
            msg = (
                f"kafka source of pipeline {pipeline!r}: heartbeat_interval_ms={heartbeat_ms}, "
                f"session_timeout_ms={session_ms}; heartbeats must come more often than the "
                "session expires (Kafka advises a third of it)"
            )
            raise ValueError(msg)
        self.config = config
        self.decode_in_dispatch = fetch.decode_in_dispatch
        self.pipeline = pipeline
        self.group = config.group or f"eventbus-{pipeline}"
        self.bootstrap_servers = config.bootstrap_servers or bootstrap_servers
        self.client = config.client or client
        self._max_in_flight = fetch.max_in_flight
        self._in_order = fetch.in_order
        self._last_dispatch: asyncio.Task[list[Outcome]] | None = None
        self._drain_timeout_s = delivery.drain_timeout_s
        self._revoke_timeout_s = (
            fetch.revoke_timeout_s if fetch.revoke_timeout_s is not None else session_ms / 1000
        )
        self._stats = dict.fromkeys(_STAT_NAMES, 0)
        #: end-to-end latency, record timestamp to sink ack: observed once per delivered batch
        #: (its oldest record's), weighed by the batch's record count.
        self.latency = Histogram(LATENCY_BOUNDS_S)
        self._fetcher = KafkaFetcher(
            config,
            fetch,
            pipeline=pipeline,
            group=self.group,
            bootstrap_servers=self.bootstrap_servers,
            client=self.client,
        )
        self._redispatch = Redispatcher(dispatch, delivery, pipeline, self._stats)
        self._retries = EventRetries(delivery.retry, self._redispatch, self._stats)
        self._delivery = Delivery(config, pipeline, sinks, delivery, self._stats)
        self._batches = BatchMaker(config, fetch.decode_in_dispatch, self._delivery.undecodable)
        self._avro = AvroTranscoder.of(config, pipeline, lambda: self._stopping)
        self._commits = Committer(
            lambda: self._fetcher.consumer,
            pipeline,
            self._stats,
            self.latency,
            hold=lambda: self._fetcher.bridging,
            transactional=delivery.exactly_once,
        )
        self._fetcher.skips_uncommitted = delivery.exactly_once and config.start_from == "earliest"
        #: exactly_once: a transaction per partition and commit interval, one producer each
        self._txns = self._transactions(delivery)
        self._queue: collections.deque[KafkaBatch] = collections.deque()
        self._progress = asyncio.Event()  # set whenever the queue changes or stop is asked
        self._deliverer: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self._stopping = False
        self._revoking = False
        self._running = False
        self._run_done = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the sinks, join the consumer group and start delivering.

        Raises:
            StackError: the broker cannot be reached.
        """
        await self._delivery.start()
        what = f"kafka source of pipeline {self.pipeline!r}"
        try:  # a consumer without READ fails only in the background: ask before joining
            await check_topic_access(
                what, self.bootstrap_servers, self.client, dict.fromkeys(self.config.topics, "READ")
            )
        except BaseException:
            await self._delivery.stop_sinks()
            raise
        try:
            await self._fetcher.start(self._on_revoked, self._on_assigned, self._on_bridged)
        except (KafkaError, KeyError, ConfigError) as e:
            # KeyError: aiokafka's SCRAM client when the broker refuses the login
            await self._delivery.stop_sinks()
            raise await kafka_connect_error(what, self.bootstrap_servers, self.client, e) from e
        self._deliverer = asyncio.create_task(
            self._deliver_loop(), name=f"eventbus-{self.pipeline}-deliver"
        )
        log.info(
            "kafka source %s: consuming %s as group %r from %s",
            self.pipeline,
            ",".join(self.config.topics),
            self.group,
            self.bootstrap_servers,
        )

    async def run(self) -> None:
        """Fetch and dispatch batches until :meth:`stop` is called.

        Raises:
            RuntimeError: the source was not started.
            Exception: delivery failed unexpectedly (the error is re-raised here).
        """
        consumer = self._fetcher.consumer
        if consumer is None:
            msg = f"kafka source of pipeline {self.pipeline!r} is not started; await start() first"
            raise RuntimeError(msg)
        self._running = True
        self._run_done.clear()
        try:
            while not self._stopping:
                if self._revoking or len(self._queue) >= self._in_flight_limit():
                    self._progress.clear()
                    await self._progress.wait()
                    continue
                consumer = self._fetcher.consumer or consumer  # the group's after a bridge
                records = await self._fetcher.fetch(consumer)
                if records and self._avro and not await self._avro.into(records, self._batches):
                    break  # value_format avro: stopped while the registry was down
                if records:
                    self._enqueue(records)
        finally:
            self._running = False
            self._run_done.set()
        if self._fatal is not None:
            raise self._fatal

    def stats(self) -> dict[str, int]:
        """Counters since start: consumed, decode_errors, batches, outputs, dropped, failed,
        dead_lettered, committed (records whose offsets were committed), in_flight (batches),
        dispatch_retries, retries, duplicates, unrouted (outputs no route took, when there is no
        default route; outputs count (output, sink) deliveries); and the reasons beyond a step's failure:
        poison (events a dispatch failed on alone, dead-lettered), too_large (outputs the sink
        refused as too large, their inputs dead-lettered), dead_letters_truncated (dead letters
        sent cut down), dead_letters_lost (dead letters refused even cut down), revoke_timeouts
        (rebalances that did not wait for the batches in flight); gap_holds (fetches cut at a
        gap in a partition's offsets and fetched again: Tansu only, 0 on Apache Kafka);
        exactly_once: txn_skipped (batches not committed: their transaction aborted, one before
        them of their partition did, or they were fetched before the partition was owned),
        txn_aborts (transactions aborted), txn_fenced (refused: a newer owner fenced them),
        txn_commits (transactions committed), txn_waiting (batches sent in an open
        transaction, waiting for its commit), txn_committing (those of them whose
        transaction's commit is under way); with a SASL password: sasl_logins_refused
        (logins the broker refused; _recent: in the last minute) and sasl_password_changes;
        value_format avro: registry_waits (fetches held while the registry was down)."""
        out = dict(self._stats)
        out["in_flight"] = len(self._queue)
        out["gap_holds"] = self._fetcher.gaps.holds
        out.update(self._txn_stats())
        out.update(login_stats(self.client))
        if self._avro is not None:
            out["registry_waits"] = self._avro.registry_waits
        return out

    def lag(self) -> dict[str, int]:
        """Per assigned partition (``topic[partition]``): the log end the last fetch reported
        minus the committed offset (records not yet delivered and committed)."""
        return self._fetcher.lag(self._commits.committed)

    def log_ends(self) -> dict[str, int]:
        """Per assigned partition (``topic[partition]``): the log end the last fetch reported
        (-1 before the first fetch of it); the autoscaler's partitions and arrival rate."""
        return self._fetcher.log_ends()

    def metrics(self) -> dict[str, Any]:
        """JSON-able observability snapshot: the latency histogram and the consumer lag."""
        return {"latency": self.latency.snapshot(), "lag": self.lag()}

    # -- batching ----------------------------------------------------------------------------
    def _enqueue(self, data: dict[TopicPartition, list[Any]]) -> None:
        if self._txns is not None:
            self._enqueue_txn(data)
            return
        batch = self._batches.make(data)
        if batch is None:
            return
        self._stats["consumed"] += batch.count
        if batch.events:
            self._stats["batches"] += 1
            if self._in_order:  # after the batch before (see FetchSettings.in_order)
                before = self._last_dispatch
                batch.task = asyncio.create_task(
                    self._redispatch.after(before, batch.events, batch.seq)
                )
                self._last_dispatch = batch.task
            else:
                batch.task = asyncio.create_task(self._redispatch(batch.events, batch.seq))
        # Delivery starts as soon as the dispatch is done: a batch waits for the one before
        # it only at the ordered sinks (see _routing.Turns), and commits in order.
        batch.delivery = asyncio.create_task(self._deliver(batch, self._delivery.reserve()))
        self._queue.append(batch)
        self._progress.set()

    # -- delivering --------------------------------------------------------------------------
    async def _deliver_loop(self) -> None:
        try:
            while True:
                if not self._queue:
                    self._progress.clear()
                    await self._progress.wait()
                    continue
                batch = self._queue[0]
                assert batch.delivery is not None
                try:
                    await batch.delivery
                except TransactionSkipped as e:  # aborted: its records are consumed again
                    self._stats["txn_skipped"] += 1
                    log.info("kafka source %s: batch %d: %s", self.pipeline, batch.seq, e)
                    self._queue.popleft()
                    self._progress.set()
                    continue
                self._commits.add(batch)
                self._queue.popleft()
                self._progress.set()
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            log.exception("kafka source %s: delivery failed; stopping", self.pipeline)
            self._fatal = e
            self._stopping = True
            self._progress.set()

    async def _deliver(self, batch: KafkaBatch, turn: Turn) -> None:
        # Batch-mates go out at once; events whose step failed and may be retried are
        # dispatched again alone (after a backoff) and delivered when they settle; the
        # batch's offsets are committed (by the deliver loop, in order) once every event has.
        try:
            outcomes: list[Outcome] = await batch.task if batch.task is not None else []
            settled, pending = self._retries.split(outcomes)
            await self._delivery.send(batch, settled, list(batch.dead), turn, not pending)
            if pending:
                rounds = self._retries.rounds(batch.events, pending, batch.seq)
                async with aclosing(rounds) as later_rounds:
                    async for later in later_rounds:
                        await self._delivery.send(batch, later, [], turn)
        except BaseException as e:
            # exactly_once: nothing of it is visible (its transaction aborts), the next go on
            turn.release(e if self._txns is None else None)
            raise
        turn.release()


# -- the kafka source kind ------------------------------------------------------------------


def _topics(raw: dict[str, Any]) -> str:
    topics = raw.get("topics") or [raw.get("topic")]
    topics = topics if isinstance(topics, list) else [topics]
    return ", ".join(str(t) for t in topics if t)


@sources.register(
    "kafka", config=KafkaSourceConfig, description="Consume a Kafka topic.", describe=_topics
)
def kafka_source(config: KafkaSourceConfig, pipeline: str) -> KafkaSourceConfig:
    """A Kafka source consumes its own topics (with a :class:`KafkaSource` in each replica, or
    in a source actor)."""
    return config
