"""What ``test_broker_faults.py`` drives: a keyed workload and its pipeline, run in process on
the three-node cluster (the cluster's helpers: ``kafka3``; the figures and checks:
``broker_fault_checks``).

A pipeline runs as a replica runs it, without Ray (``serving/_replica_sources.py``): the steps
compiled from its YAML by a :class:`~eventbus.pipelines._runner.PipelineRunner` (the join's
state in Redis) where :class:`~eventbus.serving._step_threads.StepThreads` says, a real
:class:`~eventbus.eventing.sources.KafkaSource` with the replica's fetch settings and delivery
policy (``serving._outputs.delivery_policy``: the Redis dedupe when the YAML asks for it), and
real :class:`~eventbus.eventing.sinks.KafkaSink` s (``serving._outputs.source_sinks``). The one
addition, for the figures: the dispatch and the output sink note when each batch went through
and the highest input offset per input partition behind it, so that the test can tell when
each partition's records flowed again after a fault (``broker_fault_checks.outage``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from eventbus.eventing._codecs import KafkaRecord
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.eventing.sinks import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources import FetchSettings, KafkaSource
from eventbus.pipelines import load_pipeline_text
from eventbus.pipelines._config import PipelineConfig, SinkConfig
from eventbus.pipelines._runner import PipelineRunner
from eventbus.serving._outputs import delivery_policy, source_sinks
from eventbus.serving._step_threads import StepThreads

#: Input and output partitions (the same count: a key's input and output partition match).
PARTITIONS = 4
#: Serving batch settings of the pipelines (the defaults): events in flight per source are at
#: most MAX_IN_FLIGHT * MAX_BATCH.
MAX_BATCH = 2000
MAX_IN_FLIGHT = 4

Rec = tuple[bytes, list[tuple[str, bytes]], bytes]  # key, headers, value


def partition_of(key: bytes, n: int = PARTITIONS) -> int:
    """The partition Kafka's Java client (and :class:`KafkaSink`) gives ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % n


# -- the workload ----------------------------------------------------------------------------


@dataclass
class Workload:
    """Keyed binary-mode CloudEvents per input partition; ``expected``: the (key, seq) of
    every output the pipeline must deliver."""

    parts: dict[int, list[Rec]]
    expected: set[tuple[str, int]]
    #: (key, seq) -> (input partition, offset)
    where: dict[tuple[str, int], tuple[int, int]]

    @property
    def count(self) -> int:
        return sum(len(r) for r in self.parts.values())


def workload(n: int, keys: int, seed: int) -> Workload:
    """``n`` events over ``keys`` keys, each with its key's next sequence number (``seq``):
    10% orders, 10% payments of the oldest unpaid order of the same key (a tick when there is
    none), the rest ticks.

    The pipeline keeps ticks whose seq % 10 != 3 and joins each payment with its order (the
    joined event carries the payment's key and seq): one output per kept tick and per payment,
    on the key's partition, in the key's seq order."""
    rnd = random.Random(seed)
    seqs: Counter[int] = Counter()
    unpaid: dict[int, list[str]] = defaultdict(list)
    parts: dict[int, list[Rec]] = {p: [] for p in range(PARTITIONS)}
    expected: set[tuple[str, int]] = set()
    where: dict[tuple[str, int], tuple[int, int]] = {}
    for i in range(n):
        k = rnd.randrange(keys)
        seqs[k] += 1
        seq = seqs[k]
        key = f"k{k}"
        data: dict[str, Any] = {"k": key, "seq": seq}
        r = rnd.random()
        if r < 0.1:
            type_ = "order"
            data["oid"] = f"o{i}"
            unpaid[k].append(data["oid"])
        elif r < 0.2 and unpaid[k]:
            type_ = "pay"
            data["oid"] = unpaid[k].pop(0)
            expected.add((key, seq))
        else:
            type_ = "tick"
            if seq % 10 != 3:
                expected.add((key, seq))
        headers = [
            ("ce_specversion", b"1.0"),
            ("ce_id", f"e{i}".encode()),
            ("ce_source", b"/faults"),
            ("ce_type", type_.encode()),
            ("content-type", b"application/json"),
        ]
        kb = key.encode()
        part = parts[partition_of(kb)]
        where[(key, seq)] = (partition_of(kb), len(part))
        part.append((kb, headers, orjson.dumps(data)))
    return Workload(parts, expected, where)


def pipeline_yaml(name: str, group: str, source: str, sink: str, dlq: str, dedupe: bool) -> str:
    """The pipeline: filter, convert and a join (emit every: one joined event per payment)."""
    delivery = "  delivery: {dedupe: {window_s: 600}}\n" if dedupe else ""
    return f"""\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources:
    - kafka: {{topic: {source}, group: {group}}}
  steps:
    - id: keep
      filter: "type != 'tick' || data.seq % 10 != 3"
    - id: conv
      convert: {{set: {{"data.c": "data.seq * 2"}}}}
    - id: pair
      join:
        sides:
          - {{name: order, when: "type == 'order'", key: "data.oid"}}
          - {{name: pay, when: "type == 'pay'", key: "data.oid"}}
        window_s: 600
        output:
          type: paid
          data: "{{'k': pay.data.k, 'seq': pay.data.seq, 'oid': order.data.oid}}"
  sink: {{kafka: {{topic: {sink}}}}}
  dead_letter: {{kafka: {{topic: {dlq}}}}}
{delivery}  serving: {{batch: {{max_size: {MAX_BATCH}, max_in_flight: {MAX_IN_FLIGHT}}}}}
"""


async def produce(bootstrap: str, topic: str, parts: dict[int, list[Rec]]) -> None:
    """Each partition's records in order, in record batches (acks=all; a batch goes once
    the one before it is acknowledged, so a key's records are stored in seq order)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=512 * 1024
    )

    async def one(part: int, records: list[Rec]) -> None:
        batch = producer.create_batch()
        for key, headers, value in records:
            if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                await (await producer.send_batch(batch, topic, partition=part))
                batch = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None, headers=headers)
        if batch.record_count():
            await (await producer.send_batch(batch, topic, partition=part))

    await producer.start()
    try:
        await asyncio.gather(*(one(p, r) for p, r in parts.items()))
    finally:
        await producer.stop()


# -- a pipeline in process ---------------------------------------------------------------------


Where = dict[tuple[str, int], tuple[int, int]]


def offsets_of(events: Sequence[CloudEvent | KafkaRecord], where: Where) -> dict[int, int]:
    """Per input partition, the highest input offset behind ``events`` (each carries its
    input's key and seq in its data)."""
    top: dict[int, int] = {}
    for e in events:
        if not isinstance(e, CloudEvent) or not isinstance(e.data, dict):
            continue
        at = where.get((e.data.get("k"), e.data.get("seq")))  # type: ignore[arg-type]
        if at is not None and at[1] > top.get(at[0], -1):
            top[at[0]] = at[1]
    return top


class TimedSink(KafkaSink):
    """The Kafka sink, noting when each send was acknowledged and, per input partition, the
    highest input offset behind it."""

    def __init__(self, config: KafkaSinkConfig, *, bootstrap_servers: str, where: Where) -> None:
        super().__init__(config, bootstrap_servers=bootstrap_servers)
        self.where = where
        self.acked: list[tuple[float, dict[int, int]]] = []

    async def send(self, items: Sequence[tuple[CloudEvent | KafkaRecord, bytes | None]]) -> None:
        await super().send(items)
        self.acked.append((time.monotonic(), offsets_of([e for e, _ in items], self.where)))


class InProcessPipeline:
    """A pipeline's one Kafka source, steps and sinks, run on this loop as a replica runs them."""

    def __init__(
        self, config: PipelineConfig, bootstrap: str, redis_url: str, where: Where
    ) -> None:
        self.config = config
        #: per input partition, the highest offset dispatched so far
        self.dispatched: dict[int, int] = {}
        #: when each batch was dispatched, and per input partition its highest offset
        self.dispatch_log: list[tuple[float, dict[int, int]]] = []
        self.runner = PipelineRunner(config, redis_url=redis_url)
        self.threads = StepThreads(self.runner.steps)
        (src,) = config.consumed_sources
        self.sink: TimedSink | None = None

        def make(cfg: SinkConfig) -> Any:
            if cfg is config.spec.sink:
                self.sink = TimedSink(cfg.options, bootstrap_servers=bootstrap, where=where)
                return self.sink
            return KafkaSink(cfg.options, bootstrap_servers=bootstrap)

        run = self.runner.run
        threads = self.threads
        dispatched, dispatch_log = self.dispatched, self.dispatch_log

        async def dispatch(events: list[CloudEvent]) -> list[Outcome]:
            tops = offsets_of(events, where)
            dispatch_log.append((time.monotonic(), tops))
            for p, offset in tops.items():
                dispatched[p] = max(offset, dispatched.get(p, -1))
            outcomes: list[Outcome] = await threads.call(run, events)
            return outcomes

        spec = config.spec
        self.source = KafkaSource(
            src,
            pipeline=config.name,
            bootstrap_servers=bootstrap,
            dispatch=dispatch,
            sinks=source_sinks(config, make),
            fetch=FetchSettings(
                max_batch=spec.serving.batch.max_size,
                linger_ms=config.linger_ms_of(src),
                max_in_flight=spec.serving.batch.max_in_flight,
                in_order=config.in_order,
            ),
            delivery=delivery_policy(config, redis_url),
        )
        self.task: asyncio.Task[None] | None = None
        self.stopped = False

    @classmethod
    def from_yaml(
        cls, text: str, bootstrap: str, redis_url: str, where: Where
    ) -> InProcessPipeline:
        return cls(load_pipeline_text(text), bootstrap, redis_url, where)

    async def start(self) -> None:
        await self.source.start()
        self.task = asyncio.create_task(self.source.run())

    def check_running(self) -> None:
        """Raise what stopped the source, if it stopped."""
        if self.task is not None and self.task.done():
            self.task.result()
            raise AssertionError(f"source of {self.config.name} stopped")

    def done(self, ends: dict[int, int]) -> bool:
        """Whether every input record was delivered and its offset committed."""
        self.check_running()
        topic = self.source.config.topics[0]
        lag = self.source.lag()
        seen = self.source.log_ends()
        return all(
            seen.get(f"{topic}[{p}]") == end and lag.get(f"{topic}[{p}]") == 0
            for p, end in ends.items()
        )

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        await self.source.stop(drain=True)
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)
        self.threads.close()


async def forget_state(redis_url: str, pipelines: Sequence[str], step: str = "pair") -> int:
    """Delete what the pipelines left in Redis (dedupe marks, the join's state): ~80,000 keys
    a run that the session's Redis (append-only file on) need not keep for their window."""
    import redis.asyncio as aioredis

    from eventbus._internal import keys

    client = aioredis.Redis.from_url(redis_url)
    deleted = 0
    try:
        for name in pipelines:
            for prefix in (keys.dedupe_prefix(name), keys.join_prefix(name, step)):
                batch: list[bytes] = []
                async for key in client.scan_iter(match=prefix + "*", count=10_000):
                    batch.append(key)
                    if len(batch) >= 5000:
                        deleted += await client.unlink(*batch)
                        batch.clear()
                if batch:
                    deleted += await client.unlink(*batch)
    finally:
        await client.aclose()
    return deleted


async def wait_until(check: Any, what: str, timeout_s: float, every_s: float = 0.05) -> None:
    """Poll ``check()`` until true, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)


__all__ = [
    "MAX_BATCH",
    "MAX_IN_FLIGHT",
    "PARTITIONS",
    "InProcessPipeline",
    "Where",
    "Workload",
    "forget_state",
    "offsets_of",
    "partition_of",
    "pipeline_yaml",
    "produce",
    "wait_until",
    "workload",
]
