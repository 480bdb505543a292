"""The Kafka source: a consumer-group member that feeds micro-batches to a dispatch callable.

Delivery, per the architecture's contract (at-least-once, per-partition order):

1. fetch up to ``max_batch`` records, at most once per ``linger_ms`` while records keep coming;
   a partition's records are taken only up to a gap in its offsets, which is fetched again
   until it fills (Tansu stores concurrent producers' batches out of order; see
   ``offset_gap_wait_ms``);
2. decode each record into a CloudEvent; an undecodable record is logged, counted and sent to
   the dead-letter sink (raw value as bytes data, the error in extension attributes); it never
   blocks its batch-mates;
3. call ``dispatch(events)`` once per batch, up to ``max_in_flight`` batches concurrently; a
   dispatch that raises (a Ray replica died, say) is retried with capped exponential backoff;
4. strictly in batch order: send the outputs to the sink and the failures to the dead-letter
   sink, wait for both to acknowledge, then commit ``offset + 1`` per partition. A sink that
   does not acknowledge is retried the same way; an output the sink cannot encode (not a
   CloudEvent, data not JSON) dead-letters its input event with ``ebstep: sink``.

Dead-letter events are the original input event plus the extension attributes ``ebpipeline``,
``ebstep``, ``eberrortype``, ``eberror``, ``ebattempts``, ``ebtopic``, ``ebpartition`` and
``eboffset`` (integers stay integers in structured mode; binary mode makes every attribute a
string header).

On a rebalance, the revoked callback (awaited by aiokafka) finishes and commits the batches in
flight before the partitions move; records fetched but not yet batched are dropped and fetched
again from the committed offsets. ``stop(drain=True)`` stops fetching, finishes the batches in
flight, commits and closes.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from eventbus.errors import EventDecodeError, StackError
from eventbus.eventing._codecs import RawRecord, decode_kafka, decode_kafka_fast
from eventbus.eventing._delivery import RedisDeduper, RetryPolicy, dedupe_key, injected_fault
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Dispatch, Failure, Outcome
from eventbus.eventing.sinks._base import Sink, SinkEncodeError
from eventbus.eventing.sources._base import Source
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.observability._metrics import LATENCY_BOUNDS_S, Histogram

__all__ = ["DECODE_ERROR_TYPE", "KafkaSource", "KafkaSourceConfig", "dead_letter_event"]

log = logging.getLogger(__name__)

#: ``type`` of the dead-letter event made from a record that could not be decoded.
DECODE_ERROR_TYPE = "eventbus.decode_error"

_STAT_NAMES = (
    "consumed",
    "decode_errors",
    "batches",
    "outputs",
    "dropped",
    "failed",
    "dead_lettered",
    "committed",
    "in_flight",
    "dispatch_retries",
    "retries",
    "duplicates",
)


_GAP_REFETCH_S = 0.005  # between fetches while a partition has a gap


class OffsetGaps:
    """Takes each partition's fetched records only up to the first gap in their offsets, and
    seeks back to the gap so that it is fetched again.

    On Tansu a batch's offsets are reserved before the batch is stored, so while two
    producers write one partition a fetch can return a later batch before an earlier one
    exists: a consumer that took it would skip the earlier batch for good. A gap still there
    after ``wait_s`` is taken as real (compaction, transaction markers on a real Kafka) and
    passed, with a warning.

    Args:
        wait_s: how long a gap is waited for (0: gaps are passed at once).
        name: who consumes, for the warning.
    """

    def __init__(self, wait_s: float, name: str) -> None:
        self.wait_s = wait_s
        self.name = name
        self._expected: dict[TopicPartition, int] = {}  # next offset, per partition
        self._since: dict[TopicPartition, tuple[int, float]] = {}  # missing offset, first seen

    def reset(self) -> None:
        """Forget the partitions' positions (after a rebalance or a seek elsewhere)."""
        self._expected.clear()
        self._since.clear()

    def take(
        self, consumer: Any, data: dict[TopicPartition, list[Any]], now: float
    ) -> tuple[dict[TopicPartition, list[Any]], bool]:
        """The records to take now, and whether some partition is held at a gap."""
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


@dataclass(slots=True)
class _Batch:
    seq: int
    count: int  # records, decodable or not
    events: list[CloudEvent] | list[RawRecord]  # RawRecord when decode_in_dispatch
    records: list[Any]  # per event: the ConsumerRecord it came from (key, position)
    dead: list[tuple[CloudEvent, bytes | None]]  # undecodable records as dead-letter events
    offsets: dict[TopicPartition, int]  # next offset to commit, per partition
    task: asyncio.Task[list[Outcome]] | None = field(default=None)
    oldest_ms: int = 0  # the oldest record's timestamp (end-to-end latency, per batch)


def dead_letter_event(
    original: CloudEvent, pipeline: str, failure: Failure, topic: str, partition: int, offset: int
) -> CloudEvent:
    """The dead-letter event of a failed input: the original plus the ``eb*`` attributes."""
    return original.replace(
        ebpipeline=pipeline,
        ebstep=failure.step,
        eberrortype=failure.error_type,
        eberror=failure.message,
        ebattempts=failure.attempts,
        ebtopic=topic,
        ebpartition=partition,
        eboffset=offset,
    )


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: KafkaSource) -> None:
        self._source = source

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._source._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._source._on_assigned(assigned)


class KafkaSource(Source):
    """Consumes Kafka topics as a consumer-group member and runs micro-batches through dispatch.

    The source owns its sinks' lifecycle: :meth:`start` starts them, :meth:`stop` stops them.

    Args:
        config: the source configuration.
        pipeline: the pipeline name (default group ``eventbus-{pipeline}``, dead-letter
            attribute ``ebpipeline``, logs).
        bootstrap_servers: the runtime's default broker, used when the config names none.
        dispatch: a batch of events in, one outcome per event out.
        sink: where output events go.
        dead_letter: where failed and undecodable events go; None logs and counts them.
        max_batch: most records per batch.
        linger_ms: the least time between two fetches while records keep coming (a fetch
            that fills a batch is followed at once): what arrives meanwhile makes one batch
            and one fetch. Fewer fetches matter on Tansu's memory storage, where a fetch
            lists every record batch of the partition.
        max_in_flight: most batches dispatched concurrently (outputs and commits stay in order).
        session_timeout_ms: the consumer-group session timeout. Tansu holds a group join for
            half of it, so it is also roughly the delay before the first record.
        retry_initial_s: first backoff after a failed dispatch or sink send.
        retry_max_s: the backoff cap.
        drain_timeout_s: how long :meth:`stop` waits for batches in flight.
        decode_in_dispatch: hand ``dispatch`` the records undecoded (:class:`RawRecord`) so
            that decoding (and, by returning :class:`KafkaRecord` outputs, encoding) happens
            where dispatch runs: a Ray replica, off this process's single core. A record that
            does not decode there comes back as ``Failure(step="decode")`` and is
            dead-lettered like one that failed here.
        retry: retries of events that failed in a step (None: dead-letter at once).
        dedupe: suppresses outputs already delivered (None: no dedupe).

    Example:
        >>> async def dispatch(events):
        ...     return [[e] for e in events]
        >>> source = KafkaSource(KafkaSourceConfig(topic="in"), pipeline="demo",
        ...                      bootstrap_servers="127.0.0.1:9092", dispatch=dispatch,
        ...                      sink=sink, dead_letter=None)   # doctest: +SKIP
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
        sink: Sink,
        dead_letter: Sink | None,
        max_batch: int = 2000,
        linger_ms: int = 5,
        max_in_flight: int = 4,
        session_timeout_ms: int = 6000,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 5.0,
        drain_timeout_s: float = 30.0,
        decode_in_dispatch: bool = False,
        retry: RetryPolicy | None = None,
        dedupe: RedisDeduper | None = None,
    ) -> None:
        if max_batch < 1 or max_in_flight < 1 or linger_ms < 0:
            msg = (
                f"kafka source of pipeline {pipeline!r}: max_batch={max_batch}, "
                f"max_in_flight={max_in_flight}, linger_ms={linger_ms}; max_batch and "
                "max_in_flight must be >= 1 and linger_ms >= 0"
            )
            raise ValueError(msg)
        self.config = config
        self.decode_in_dispatch = decode_in_dispatch
        self.pipeline = pipeline
        self.group = config.group or f"eventbus-{pipeline}"
        self.bootstrap_servers = config.bootstrap_servers or bootstrap_servers
        self._dispatch = dispatch
        self._retry = retry
        self._dedupe = dedupe
        self._sink = sink
        self._dead_letter = dead_letter
        self._max_batch = max_batch
        self._linger_s = linger_ms / 1000
        self._next_fetch_at = 0.0
        self._gaps = OffsetGaps(config.offset_gap_wait_ms / 1000, f"kafka source {pipeline}")
        self._max_in_flight = max_in_flight
        self._session_timeout_ms = session_timeout_ms
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._drain_timeout_s = drain_timeout_s
        self._stats = dict.fromkeys(_STAT_NAMES, 0)
        #: end-to-end latency, record timestamp to sink ack: observed once per delivered batch
        #: (its oldest record's), weighed by the batch's record count.
        self.latency = Histogram(LATENCY_BOUNDS_S)
        self._committed_offsets: dict[TopicPartition, int] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._queue: collections.deque[_Batch] = collections.deque()
        self._progress = asyncio.Event()  # set whenever the queue changes or stop is asked
        self._deliverer: asyncio.Task[None] | None = None
        # Delivered batches whose offsets are not committed yet, and the one commit running:
        # commits are coalesced so a commit round trip never holds up the next delivery.
        self._to_commit: list[_Batch] = []
        self._committer: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self._stopping = False
        self._revoking = False
        self._generation = 0  # bumped on each revocation: fetched records older are dropped
        self._running = False
        self._run_done = asyncio.Event()
        self._seq = 0
        self._sources: dict[str, str] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the sinks, join the consumer group and start delivering.

        Raises:
            StackError: the broker cannot be reached.
        """
        await self._sink.start()
        if self._dead_letter is not None:
            await self._dead_letter.start()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            group_id=self.group,
            client_id=f"eventbus-{self.pipeline}",
            enable_auto_commit=False,
            auto_offset_reset=self.config.start_from,
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=max(100, self._session_timeout_ms // 3),
            max_poll_records=self._max_batch,
            fetch_max_wait_ms=self.config.fetch_max_wait_ms,
            max_partition_fetch_bytes=4 * 1024 * 1024,
        )
        consumer.subscribe(self.config.topics, listener=_Listener(self))
        try:
            await consumer.start()
        except KafkaError as e:
            await consumer.stop()
            await self._sink.stop()
            if self._dead_letter is not None:
                await self._dead_letter.stop()
            msg = (
                f"kafka source of pipeline {self.pipeline!r} cannot reach the broker at "
                f"{self.bootstrap_servers}: {e}; check that it runs and the address is right "
                "(`eventbus up` starts a local one)"
            )
            raise StackError(msg) from e
        self._consumer = consumer
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
        consumer = self._consumer
        if consumer is None:
            msg = f"kafka source of pipeline {self.pipeline!r} is not started; await start() first"
            raise RuntimeError(msg)
        self._running = True
        self._run_done.clear()
        try:
            while not self._stopping:
                if self._revoking or len(self._queue) >= self._max_in_flight:
                    self._progress.clear()
                    await self._progress.wait()
                    continue
                records = await self._fetch(consumer)
                if records:
                    self._enqueue(records)
        finally:
            self._running = False
            self._run_done.set()
        if self._fatal is not None:
            raise self._fatal

    async def stop(self, drain: bool = True) -> None:
        """Stop fetching; with ``drain``, finish, deliver and commit the batches in flight.

        Batches not finished within ``drain_timeout_s`` (or at all without ``drain``) are not
        committed: their records are delivered again to whoever consumes the partition next.
        """
        self._stopping = True
        self._progress.set()
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
        if self._deliverer is not None:
            tasks.append(self._deliverer)
        if self._committer is not None:
            tasks.append(self._committer)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._queue.clear()
        self._to_commit.clear()
        self._deliverer = None
        self._committer = None
        self._progress.set()  # wakes a revocation callback still waiting for the drain
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
        await self._sink.stop()
        if self._dead_letter is not None:
            await self._dead_letter.stop()
        if self._dedupe is not None:
            await self._dedupe.close()

    def stats(self) -> dict[str, int]:
        """Counters since start: consumed, decode_errors, batches, outputs, dropped, failed,
        dead_lettered, committed (records whose offsets were committed), in_flight (batches),
        dispatch_retries."""
        out = dict(self._stats)
        out["in_flight"] = len(self._queue)
        return out

    def lag(self) -> dict[str, int]:
        """Per assigned partition (``topic[partition]``): the log end the last fetch reported
        minus the committed offset (records not yet delivered and committed).

        The log end is the high watermark of the latest fetch response, so it is as fresh as
        the last fetch; on the embedded Tansu broker ``end_offsets()`` (ListOffsets) is not
        used because Tansu answers it with the last record batch's base offset + 1.
        """
        consumer = self._consumer
        if consumer is None:
            return {}
        out: dict[str, int] = {}
        for tp in consumer.assignment():
            end = consumer.highwater(tp)
            if end is None:
                continue
            done = self._committed_offsets.get(tp)
            if done is None:
                continue
            out[f"{tp.topic}[{tp.partition}]"] = max(0, end - done)
        return out

    def metrics(self) -> dict[str, Any]:
        """JSON-able observability snapshot: the latency histogram and the consumer lag."""
        return {"latency": self.latency.snapshot(), "lag": self.lag()}

    # -- fetching ----------------------------------------------------------------------------
    async def _fetch(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, list[Any]]:
        """Up to ``max_batch`` records, per partition in offset order; {} when none came."""
        loop = asyncio.get_running_loop()
        wait = self._next_fetch_at - loop.time()
        if wait > 0:  # records keep coming: let more gather at the broker (see linger_ms)
            await asyncio.sleep(wait)
        generation = self._generation
        data: dict[TopicPartition, list[Any]] = await consumer.getmany(
            timeout_ms=100, max_records=self._max_batch
        )
        if not data:
            return {}
        count = sum(len(recs) for recs in data.values())
        if count < self._max_batch:
            self._next_fetch_at = loop.time() + self._linger_s
        if generation == self._generation and self._gaps.wait_s > 0:
            now = loop.time()
            data, held = self._gaps.take(consumer, data, now)
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
                    consumer.seek(
                        tp, committed if committed is not None else min(r.offset for r in recs)
                    )
            return {}
        return data

    def _enqueue(self, data: dict[TopicPartition, list[Any]]) -> None:
        events: list[Any] = []
        sources: list[Any] = []
        dead: list[tuple[CloudEvent, bytes | None]] = []
        offsets: dict[TopicPartition, int] = {}
        default_type = self.config.type
        decode_fast = decode_kafka_fast
        count = 0
        oldest = 0
        for tp, records in data.items():
            if not records:
                continue
            ts = records[0].timestamp
            if ts is not None and ts > 0 and (oldest == 0 or ts < oldest):
                oldest = ts
            topic, partition = tp.topic, tp.partition
            default_source = self._sources.get(topic)
            if default_source is None:
                default_source = self._sources[topic] = self.config.source or f"kafka://{topic}"
            count += len(records)
            offsets[tp] = records[-1].offset + 1
            if self.decode_in_dispatch:
                events.extend(
                    RawRecord(r.value, r.headers, r.key, topic, partition, r.offset)
                    for r in records  # type: ignore[misc]
                )
                sources.extend(records)
                continue
            for r in records:
                event = decode_fast(r.value, r.headers, r.key)
                if event is not None:
                    events.append(event)
                    sources.append(r)
                    continue
                try:
                    event = self._decode(r, default_type, default_source)
                except EventDecodeError as e:
                    self._stats["decode_errors"] += 1
                    log.warning(
                        "kafka source %s: undecodable record %s[%d]@%d: %s",
                        self.pipeline,
                        r.topic,
                        r.partition,
                        r.offset,
                        e,
                        extra={"pipeline": self.pipeline, "step": "decode"},
                    )
                    dead.append((self._decode_dead_letter(r, e, default_source), r.key))
                    continue
                events.append(event)
                sources.append(r)
        if not count:
            return
        self._stats["consumed"] += count
        self._seq += 1
        batch = _Batch(self._seq, count, events, sources, dead, offsets, oldest_ms=oldest)
        if events:
            self._stats["batches"] += 1
            batch.task = asyncio.create_task(self._dispatch_with_retry(batch))
        self._queue.append(batch)
        self._progress.set()

    @staticmethod
    def _decode(r: Any, default_type: str, default_source: str) -> CloudEvent:
        return decode_kafka(
            r.value,
            r.headers,
            key=r.key,
            topic=r.topic,
            partition=r.partition,
            offset=r.offset,
            default_type=default_type,
            default_source=default_source,
        )

    def _decode_dead_letter(self, r: Any, error: EventDecodeError, source: str) -> CloudEvent:
        attrs: dict[str, Any] = {
            "specversion": "1.0",
            "id": f"{r.topic}-{r.partition}-{r.offset}",
            "source": source,
            "type": DECODE_ERROR_TYPE,
        }
        if r.value is not None:
            attrs["datacontenttype"] = "application/octet-stream"
        attrs.update(
            ebpipeline=self.pipeline,
            ebstep="decode",
            eberrortype=type(error).__name__,
            eberror=str(error),
            ebattempts=1,
            ebtopic=r.topic,
            ebpartition=r.partition,
            eboffset=r.offset,
        )
        return CloudEvent(attrs, None if r.value is None else bytes(r.value))

    # -- dispatching -------------------------------------------------------------------------
    async def _dispatch_with_retry(self, batch: _Batch) -> list[Outcome]:
        return await self._dispatch_events(batch.events, batch.seq)

    async def _dispatch_events(self, events: list[Any], seq: int) -> list[Outcome]:
        """Dispatch until it answers (a failed call, e.g. a replica that died, is retried)."""
        attempt = 0
        n = len(events)
        while True:
            try:
                outcomes = await self._dispatch(events)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any dispatch failure is retried
                attempt += 1
                self._stats["dispatch_retries"] += 1
                delay = min(self._retry_initial_s * 2 ** (attempt - 1), self._retry_max_s)
                log.warning(
                    "kafka source %s: dispatch of batch %d (%d events) failed (attempt %d): "
                    "%s: %s; retrying in %.2f s",
                    self.pipeline,
                    seq,
                    n,
                    attempt,
                    type(e).__name__,
                    e,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            if len(outcomes) != n:
                message = (
                    f"dispatch returned {len(outcomes)} outcomes for {n} events; a dispatch "
                    "must return exactly one outcome per event, in order"
                )
                log.error("kafka source %s: %s", self.pipeline, message)
                return [Failure("dispatch", "DispatchContractError", message)] * n
            return outcomes

    # -- delivering --------------------------------------------------------------------------
    async def _deliver_loop(self) -> None:
        try:
            while True:
                if not self._queue:
                    self._progress.clear()
                    await self._progress.wait()
                    continue
                batch = self._queue[0]
                outcomes: list[Outcome] = await batch.task if batch.task is not None else []
                await self._deliver(batch, outcomes)
                self._queue.popleft()
                self._progress.set()
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            log.exception("kafka source %s: delivery failed; stopping", self.pipeline)
            self._fatal = e
            self._stopping = True
            self._progress.set()

    async def _deliver(self, batch: _Batch, outcomes: list[Outcome]) -> None:
        # Batch-mates go out at once; events whose step failed and may be retried are
        # dispatched again alone (after a backoff) and delivered when they settle; the
        # batch's offsets are committed only once every event has.
        retry = self._retry
        pending: list[int] = []
        if retry is not None and retry.enabled:
            pending = [
                i
                for i, o in enumerate(outcomes)
                if type(o) is Failure and retry.may_retry(o.step, 1, 0.0)
            ]
        if pending:
            skip = set(pending)
            first: Any = [(i, o, 1) for i, o in enumerate(outcomes) if i not in skip]
        else:  # the usual case: no tuple list per batch (zip reuses its tuple)
            first = zip(range(len(outcomes)), outcomes, itertools.repeat(1))
        await self._send_outcomes(batch, first, list(batch.dead))
        attempt = 1
        first_failure = time.monotonic()
        while pending:
            assert retry is not None
            await asyncio.sleep(retry.delay(attempt))
            attempt += 1
            self._stats["retries"] += len(pending)
            again = await self._dispatch_events([batch.events[i] for i in pending], batch.seq)
            age = time.monotonic() - first_failure
            settled: list[tuple[int, Outcome, int]] = []
            still: list[int] = []
            for i, o in zip(pending, again):
                if type(o) is Failure and retry.may_retry(o.step, attempt, age):
                    still.append(i)
                else:
                    if (
                        type(o) is Failure
                        and retry.max_age_s is not None
                        and age >= retry.max_age_s
                    ):
                        o = Failure(
                            o.step,
                            o.error_type,
                            f"{o.message} (gave up: max_age_s {retry.max_age_s:g} reached)",
                            o.attempts,
                        )
                    settled.append((i, o, attempt))
            await self._send_outcomes(batch, settled, [])
            pending = still
        await self._commit(batch)

    async def _send_outcomes(
        self,
        batch: _Batch,
        items: Iterable[tuple[int, Outcome, int]],
        dead: list[tuple[CloudEvent, bytes | None]],
    ) -> None:
        """Send the outputs and dead letters of some events of a batch; wait for the acks."""
        outputs: list[tuple[CloudEvent, bytes | None]] = []
        origins: list[int] = []  # per output: the index of its input event
        dropped = failed = 0
        for i, outcome, attempts in items:
            if isinstance(outcome, Failure):
                if outcome.step == "decode" and type(batch.events[i]) is RawRecord:
                    self._stats["decode_errors"] += 1
                    r = batch.records[i]
                    log.warning(
                        "kafka source %s: undecodable record %s[%d]@%d: %s",
                        self.pipeline,
                        r.topic,
                        r.partition,
                        r.offset,
                        outcome.message,
                        extra={"pipeline": self.pipeline, "step": "decode"},
                    )
                    default_source = self.config.source or f"kafka://{r.topic}"
                    error = EventDecodeError(outcome.message)
                    dead.append((self._decode_dead_letter(r, error, default_source), r.key))
                    continue
                failed += 1
                if attempts > 1:  # dispatched again by the retry policy: count every try
                    outcome = Failure(
                        outcome.step,
                        outcome.error_type,
                        outcome.message,
                        outcome.attempts + attempts - 1,
                    )
                self._dead_letter_failure(batch, i, outcome, dead)
            elif outcome:
                key = batch.records[i].key
                for out in outcome:
                    outputs.append((out, key))
                    origins.append(i)
            else:
                dropped += 1
        keys: list[str | None] = []
        dedupe = self._dedupe
        if dedupe is not None and outputs:
            keys = dedupe.digests([dedupe_key(o) for o, _ in outputs])
            seen = await dedupe.claim(keys, self._sink)
            injected_fault(self.pipeline, "after-claim")
            if any(seen):
                self._stats["duplicates"] += sum(seen)
                keep = [j for j, s in enumerate(seen) if not s]
                outputs = [outputs[j] for j in keep]
                origins = [origins[j] for j in keep]
                keys = [keys[j] for j in keep]
        dead_task = asyncio.ensure_future(
            self._send_with_retry(self._dead_letter, dead, "dead_letter", batch.seq)
        )
        try:
            unencodable = await self._send_with_retry(self._sink, outputs, "sink", batch.seq)
            if dedupe is not None and keys:
                # A process killed before this mark leaves the outputs pending: the next owner
                # of the batch searches the sink for them (see _delivery).
                injected_fault(self.pipeline, "after-sink-ack")
                await dedupe.mark(
                    [k for j, k in enumerate(keys) if j not in unencodable], hashed=True
                )
        finally:
            dead_unencodable = await dead_task
        dead_lettered = len(dead) - len(dead_unencodable) if self._dead_letter is not None else 0
        if unencodable:
            # Outputs the sink cannot encode will never go through: dead-letter their inputs.
            more: list[tuple[CloudEvent, bytes | None]] = []
            for index, (error_type, message) in unencodable.items():
                failed += 1
                failure = Failure("sink", error_type, message)
                self._dead_letter_failure(batch, origins[index], failure, more)
            lost = await self._send_with_retry(self._dead_letter, more, "dead_letter", batch.seq)
            dead_lettered += len(more) - len(lost) if self._dead_letter is not None else 0
        self._stats["outputs"] += len(outputs) - len(unencodable)
        self._stats["dead_lettered"] += dead_lettered
        self._stats["dropped"] += dropped
        self._stats["failed"] += failed

    def _dead_letter_failure(
        self,
        batch: _Batch,
        i: int,
        failure: Failure,
        dead: list[tuple[CloudEvent, bytes | None]],
    ) -> None:
        record = batch.records[i]
        topic, partition, offset = record.topic, record.partition, record.offset
        original = batch.events[i]
        if type(original) is RawRecord:  # decoded on the replica: decode this one again here
            original = self._decode(
                record, self.config.type, self.config.source or f"kafka://{topic}"
            )
        event_id = original.attributes.get("id")
        extra = {"pipeline": self.pipeline, "step": failure.step, "event_id": event_id}
        if self._dead_letter is None:
            log.error(
                "kafka source %s: event %s from %s[%d]@%d failed in step %r: %s: %s "
                "(no dead_letter sink configured; the event is dropped)",
                self.pipeline,
                event_id,
                topic,
                partition,
                offset,
                failure.step,
                failure.error_type,
                failure.message,
                extra=extra,
            )
            return
        # Failures are rare: one line per dead-lettered event (none per delivered one).
        log.warning(
            "kafka source %s: event %s from %s[%d]@%d failed in step %r (%s: %s): dead-lettered",
            self.pipeline,
            event_id,
            topic,
            partition,
            offset,
            failure.step,
            failure.error_type,
            failure.message,
            extra=extra,
        )
        dead.append(
            (
                dead_letter_event(original, self.pipeline, failure, topic, partition, offset),
                record.key,
            )
        )

    async def _send_with_retry(
        self,
        sink: Sink | None,
        items: Sequence[tuple[CloudEvent, bytes | None]],
        what: str,
        seq: int,
    ) -> dict[int, tuple[str, str]]:
        """Send until acknowledged; return the items the sink cannot encode (never sent)."""
        if sink is None or not items:
            return {}
        attempt = 0
        unencodable: dict[int, tuple[str, str]] = {}
        index = list(range(len(items)))  # position in ``items`` of each item still to send
        while True:
            try:
                await sink.send(items)
                return unencodable
            except asyncio.CancelledError:
                raise
            except SinkEncodeError as e:
                log.error("kafka source %s: %s: %s", self.pipeline, what, e)
                for i, problem in e.failures.items():
                    unencodable[index[i]] = problem
                keep = [i for i in range(len(items)) if i not in e.failures]
                items = [items[i] for i in keep]
                index = [index[i] for i in keep]
                if not items:
                    return unencodable
            except Exception as e:  # noqa: BLE001 - not acknowledged: send again
                attempt += 1
                delay = min(self._retry_initial_s * 2 ** (attempt - 1), self._retry_max_s)
                log.warning(
                    "kafka source %s: %s did not acknowledge batch %d (%d events, attempt %d): "
                    "%s: %s; retrying in %.2f s",
                    self.pipeline,
                    what,
                    seq,
                    len(items),
                    attempt,
                    type(e).__name__,
                    e,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _commit(self, batch: _Batch) -> None:
        """Queue a delivered batch's offsets for the coalesced committer."""
        if batch.oldest_ms:
            self.latency.observe(max(0.0, time.time() - batch.oldest_ms / 1000), batch.count)
        self._to_commit.append(batch)
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_loop())

    async def _commit_loop(self) -> None:
        while self._to_commit:
            batches, self._to_commit = self._to_commit, []
            await self._commit_now(batches)

    async def _flush_commits(self) -> None:
        """Wait until every delivered batch's offsets were committed (or given up)."""
        while self._to_commit or (self._committer is not None and not self._committer.done()):
            if self._committer is None or self._committer.done():
                self._committer = asyncio.create_task(self._commit_loop())
            await asyncio.shield(self._committer)

    async def _commit_now(self, batches: list[_Batch]) -> None:
        consumer = self._consumer
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
                self.pipeline,
                seqs,
                e,
            )
            return
        except KafkaError as e:
            # A later commit covers these offsets; at worst the records are consumed again.
            log.warning("kafka source %s: commit of batches %s failed: %r", self.pipeline, seqs, e)
            return
        self._committed_offsets.update(offsets)
        for batch in batches:
            if all(tp in offsets for tp in batch.offsets):
                self._stats["committed"] += batch.count
            else:
                self._stats["committed"] += _count_in(batch, offsets)

    # -- rebalancing -------------------------------------------------------------------------
    async def _wait_drained(self) -> None:
        while self._queue and self._deliverer is not None and not self._deliverer.done():
            self._progress.clear()
            await self._progress.wait()
        await self._flush_commits()

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self._generation += 1
        self._gaps.reset()  # positions go back to the committed offsets
        self._revoking = True
        try:
            if self._queue and self._fatal is None:
                log.info(
                    "kafka source %s: partitions revoked (%s); finishing %d batches in flight",
                    self.pipeline,
                    ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(revoked)),
                    len(self._queue),
                )
                await self._wait_drained()
        finally:
            self._revoking = False
            self._progress.set()

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info(
            "kafka source %s: assigned %s",
            self.pipeline,
            ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(assigned)) or "nothing",
        )


def _count_in(batch: _Batch, offsets: dict[TopicPartition, int]) -> int:
    # Only some partitions were still assigned: count the batch's records of those.
    kept = {(tp.topic, tp.partition) for tp in offsets}
    decoded = sum(1 for r in batch.records if (r.topic, r.partition) in kept)
    undecodable = sum(
        1
        for event, _ in batch.dead
        if (event.attributes["ebtopic"], event.attributes["ebpartition"]) in kept
    )
    return decoded + undecodable
