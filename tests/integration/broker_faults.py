"""What ``test_broker_faults.py`` drives: a keyed workload, pipelines run in process on the
three-node cluster, the fault's figures and the check of the output topics.

A pipeline runs as a replica runs it, without Ray (``serving/_replica_sources.py``): the steps
compiled from its YAML by a :class:`~eventbus.pipelines._runner.PipelineRunner` (the join's
state in Redis) where :class:`~eventbus.serving._step_threads.StepThreads` says, a real
:class:`~eventbus.eventing.sources.KafkaSource` with the replica's fetch settings and delivery
policy (``serving._outputs.delivery_policy``: the Redis dedupe when the YAML asks for it), and
real :class:`~eventbus.eventing.sinks.KafkaSink` s (``serving._outputs.source_sinks``). The one
addition, for the figures: the dispatch and the output sink note when each batch went through
and the highest input offset per input partition behind it, so that the test can tell when
each partition's records flowed again after a fault (:func:`outage`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from eventbus._internal.kafka_broker import KafkaCluster
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


# -- the cluster -------------------------------------------------------------------------------


def placement(leads: dict[int, int], nodes: Sequence[int] = (1, 2, 3)) -> dict[int, list[int]]:
    """A replica assignment: partition -> [its leader, the other nodes] (replication 3)."""
    return {p: [leader, *(n for n in nodes if n != leader)] for p, leader in leads.items()}


async def create_topics(bootstrap: str, topics: dict[str, dict[int, list[int]]]) -> None:
    """Create topics with the given replica assignments (the first replica leads), trying
    again while a broker that was just restarted is not registered yet."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        deadline = time.monotonic() + 60
        todo = dict(topics)
        while todo:
            answer = await admin.create_topics(
                [NewTopic(t, -1, -1, replica_assignments=a) for t, a in todo.items()],
                timeout_ms=10_000,
            )
            errors = {t: (code, rest) for t, code, *rest in answer.topic_errors if code}
            todo = {t: a for t, a in todo.items() if t in errors and errors[t][0] != 36}
            if todo and time.monotonic() > deadline:
                raise AssertionError(f"topics not created: {errors}")
            if todo:
                await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def groups_coordinated(
    bootstrap: str, prefix: str, count: int, by: Any, attempts: int = 200
) -> list[str]:
    """``count`` group ids ``{prefix}-<n>`` whose coordinator's node id satisfies ``by``
    (asked with FindCoordinator: the leader of the group's ``__consumer_offsets`` partition)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    out: list[str] = []
    try:
        deadline = time.monotonic() + 60
        n = 0
        while len(out) < count:
            group = f"{prefix}-{n}"
            try:
                node = await admin.find_coordinator(group)
            except KafkaError:  # __consumer_offsets being created, a coordinator moving
                assert time.monotonic() < deadline, "no group coordinator"
                await asyncio.sleep(0.1)
                continue
            n += 1
            assert n < attempts, f"no group of {prefix} coordinated as wanted"
            if by(node):
                out.append(group)
    finally:
        await admin.close()
    return out


async def coordinators(bootstrap: str) -> Counter[int]:
    """Node id -> how many ``__consumer_offsets`` partitions it leads (for how many groups
    it can be the coordinator); the topic is made first if it is not there yet."""
    await groups_coordinated(bootstrap, "bf-probe", 1, lambda _: True)
    return Counter((await leaders(bootstrap, "__consumer_offsets", 10)).values())


async def leaders(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    """Partition -> its leader's node id."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            (desc,) = await admin.describe_topics([topic])
            found = {p["partition"]: p["leader"] for p in desc["partitions"]}
            if len(found) == partitions and all(v >= 0 for v in found.values()):
                return found
            assert time.monotonic() < deadline, f"{topic}: leaders {found}"
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def cluster_healthy(cluster: KafkaCluster, timeout_s: float = 120.0) -> None:
    """Start the nodes that are down; wait until every broker is registered."""
    down = [n for n in cluster.nodes if not n.pid]
    for node in down:
        await asyncio.to_thread(cluster.start_node, node)
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        while len((await admin.describe_cluster())["brokers"]) < len(cluster.nodes):
            assert time.monotonic() < deadline, "a broker did not register"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


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


# -- figures and checks --------------------------------------------------------------------------


def _resumed(
    log: list[tuple[float, dict[int, int]]], fault_at: float, before: dict[int, int]
) -> dict[int, float]:
    """Per partition, seconds from the fault to the first entry of ``log`` past ``before``."""
    out: dict[int, float] = {}
    for t, tops in log:
        if t < fault_at:
            continue
        for p, offset in tops.items():
            if p not in out and offset > before.get(p, -1):
                out[p] = t - fault_at
    return out


def outage(
    pipe: InProcessPipeline, fault_at: float, before: dict[int, int], ends: dict[int, int]
) -> dict[str, float]:
    """How long a pipeline's output stopped after the fault at ``fault_at``.

    Per input partition with records left, the time from the fault until the sink
    acknowledged an output of a record dispatched after the fault (past ``before``, the
    highest offsets dispatched before it): the partition's records flow end to end again.
    ``resume_s``: the slowest partition's (the one the fault hit); ``resume_min_s``: the
    fastest's (the batches queued before it, the machine's load). ``fetch_resume_s``: the
    slowest partition's time until a record past ``before`` was dispatched (the consumer's
    part). ``stall_s``: the longest time after the fault without any acknowledged output."""
    acked = pipe.sink.acked if pipe.sink is not None else []
    left = [p for p, end in ends.items() if before.get(p, -1) < end - 1]
    nan = float("nan")
    out_at = _resumed(acked, fault_at, before)
    in_at = _resumed(pipe.dispatch_log, fault_at, before)
    prev, stall = fault_at, 0.0
    for t, _ in acked:
        if t >= fault_at:
            stall, prev = max(stall, t - prev), t

    def worst(at: dict[int, float], pick: Any = max) -> float:
        return round(pick(at.get(p, nan) for p in left), 3) if left else 0.0

    return {
        "resume_s": worst(out_at),
        "resume_min_s": worst(out_at, min),
        "fetch_resume_s": worst(in_at),
        "stall_s": round(stall, 3),
    }


def cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """User + system CPU seconds of processes so far, by pid (from ``/proc``; gone ones left
    out: compare only the pids both readings have)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


@dataclass
class Delivered:
    """What an output topic holds: per partition, the (key, seq) of each record in order."""

    by_partition: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    #: records whose partition is not their record key's (as the sink partitions keyed records)
    misplaced: int = 0
    ids: Counter[bytes] = field(default_factory=Counter)

    def counts(self) -> Counter[tuple[str, int]]:
        return Counter(x for recs in self.by_partition.values() for x in recs)


async def read_topic(bootstrap: str, topic: str, timeout_s: float = 120.0) -> Delivered:
    """Read ``topic`` from the beginning to its end as it is now, ``read_committed``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    out = Delivered()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        todo = {tp for tp in tps if ends[tp] > 0}
        for tp in tps:
            out.by_partition[tp.partition] = []
        deadline = time.monotonic() + timeout_s
        while todo:
            assert time.monotonic() < deadline, f"{topic}: not read to {ends} in {timeout_s} s"
            data = await consumer.getmany(*todo, timeout_ms=200, max_records=20_000)
            for tp, records in data.items():
                got = out.by_partition[tp.partition]
                for r in records:
                    d = orjson.loads(r.value)
                    got.append((d["k"], d["seq"]))
                    if r.key is None or partition_of(r.key) != tp.partition:
                        out.misplaced += 1
                    for name, value in r.headers:
                        if name == "ce_id":
                            out.ids[value] += 1
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await consumer.stop()
    return out


@dataclass
class Verdict:
    lost: int
    unexpected: int
    duplicates: int
    order_breaks: list[str]
    misplaced: int
    #: distinct CloudEvent ids and distinct (key, seq) delivered: equal when each output's id
    #: stands for its (key, seq), as the dedupe (by source + id) assumes
    ids_vs_pairs: tuple[int, int]

    def as_dict(self) -> dict[str, Any]:
        return {
            "lost": self.lost,
            "unexpected": self.unexpected,
            "duplicates": self.duplicates,
            "order_breaks": len(self.order_breaks),
            "misplaced": self.misplaced,
        }


def judge(out: Delivered, expected: set[tuple[str, int]]) -> Verdict:
    """Lost, unexpected and duplicated outputs; per key, whether the first delivery of each
    seq came in seq order on each partition (a redelivered range comes again after, as
    duplicates).

    A key's ticks go to its partition (the record key is the input's); its joined events go
    where their join key (the order id, the join's ``partitionkey``) hashes: on each
    partition a key's outputs must still be in seq order (the sink writes batches in order).
    """
    counts = out.counts()
    got = set(counts)
    breaks: list[str] = []
    for p, recs in out.by_partition.items():
        last: dict[str, int] = {}
        first: set[tuple[str, int]] = set()
        for key, seq in recs:
            if (key, seq) in first:  # a duplicate: order is judged on first deliveries
                continue
            first.add((key, seq))
            prev = last.get(key, 0)
            if seq <= prev:
                breaks.append(f"{key}: {seq} after {prev} on partition {p}")
            last[key] = max(seq, prev)
    return Verdict(
        lost=len(expected - got),
        unexpected=len(got - expected),
        duplicates=sum(counts.values()) - len(got),
        order_breaks=breaks,
        misplaced=out.misplaced,
        ids_vs_pairs=(len(out.ids), len(got)),
    )


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
    "Delivered",
    "InProcessPipeline",
    "Verdict",
    "Where",
    "Workload",
    "cluster_healthy",
    "coordinators",
    "cpu_seconds",
    "groups_coordinated",
    "create_topics",
    "judge",
    "leaders",
    "offsets_of",
    "outage",
    "partition_of",
    "pipeline_yaml",
    "placement",
    "produce",
    "read_topic",
    "wait_until",
    "workload",
]
