"""Dead-letter redrive: send a pipeline's dead letters back through its steps
(``eventbus redrive``).

The dead-letter topic is read with a plain consumer (no group, nothing committed) from the
start up to the ends it has when the redrive starts, so dead letters that the redrive itself
writes are not read again. A record is redriven when it is a dead letter of this pipeline
(``ebpipeline``), was written at or after ``since``, and the ``where`` CEL expression (over the
dead letter, ``eb*`` attributes included: ``ebstep == 'score'``) holds. Its ``eb*`` attributes
are removed, and the event runs through the deployed pipeline's steps: outputs go to its sink
through dedupe by ``source`` + ``id`` (outputs the sink already has are skipped, so a second
redrive of the same dead letters delivers nothing twice), failures to the dead-letter sink
again with fresh ``eb*`` attributes. The dead-letter topic keeps every record (a Kafka topic
cannot delete one): the report says what happened to each.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from eventbus.errors import ConfigError
from eventbus.eventing._aiokafka_adapter import refresh_metadata
from eventbus.eventing._codecs import decode_kafka_records
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing._outcome import Failure, Outcome
from eventbus.pipelines._config import PipelineConfig

__all__ = ["RedriveReport", "compile_where", "redrive"]

#: A partition that yields nothing this long before its end fails the redrive.
_STALL_S = 30.0


@dataclass
class RedriveReport:
    """How many dead letters went where.

    Attributes:
        topic: the dead-letter topic read.
        read: records read (up to the ends the topic had at the start).
        before_since: written before ``--since``: left alone.
        other_pipeline: dead letters of another pipeline sharing the topic: left alone.
        not_matched: ``--filter`` was false: left alone.
        undecodable: not a CloudEvent (a raw record): left alone.
        not_dead_letters: CloudEvents without the ``eb*`` attributes: left alone.
        repeats: a dead letter met again in this run (dead-lettered again by an earlier
            redrive): redriven once.
        redriven: sent through the steps (with ``--dry-run``: would be).
        outputs: outputs delivered to the sink.
        duplicates: outputs the sink already had (dedupe): not sent again.
        filtered: dropped by a filter step.
        unrouted: outputs no route took (a pipeline with ``routes:`` and no default route).
        dead_lettered: failed again, written to the dead-letter topic anew.
        by_step: redriven dead letters per step they had failed in (``ebstep``).
        dry_run: nothing was sent.
    """

    topic: str
    read: int = 0
    before_since: int = 0
    other_pipeline: int = 0
    not_matched: int = 0
    undecodable: int = 0
    not_dead_letters: int = 0
    repeats: int = 0
    redriven: int = 0
    outputs: int = 0
    duplicates: int = 0
    filtered: int = 0
    unrouted: int = 0
    dead_lettered: int = 0
    by_step: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return asdict(self)


def compile_where(expression: str) -> Callable[[CloudEvent], bool]:
    """A predicate over dead letters from a CEL expression.

    Raises:
        ConfigError: the expression does not compile (naming it, where, and why).
    """
    from eventbus import cel
    from eventbus.pipelines._activation import activation_builder, check_identifiers

    try:
        program = cel.compile(expression)
        check_identifiers(program)
    except cel.CELError as e:
        msg = f"--filter {expression!r} is not a valid CEL expression: {e}"
        raise ConfigError(msg) from None
    build = activation_builder(program.variables)

    def where(e: CloudEvent) -> bool:
        try:
            return program.evaluate(build(e)) is True
        except cel.CELError:
            return False  # absent fields and the like: not matched

    return where


def _strip(event: CloudEvent) -> CloudEvent:
    attrs = {k: v for k, v in event.attributes.items() if not k.startswith("eb")}
    return CloudEvent(attrs, event.data)


async def redrive(
    config: PipelineConfig,
    *,
    bootstrap: str,
    redis_url: str | None,
    dispatch: Callable[[list[CloudEvent]], Any],
    since_ms: int | None = None,
    where: str | None = None,
    dry_run: bool = False,
    batch_size: int = 500,
    progress: Callable[[RedriveReport], None] | None = None,
    kafka_client: KafkaClientConfig | None = None,
) -> RedriveReport:
    """Redrive ``config``'s dead letters (see the module docstring).

    Args:
        config: the deployed pipeline.
        bootstrap: the stack's Kafka bootstrap servers (the topic's, unless its sink names one).
        redis_url: Redis, for dedupe (required unless ``dry_run``).
        dispatch: ``await dispatch(events)`` gives one outcome per event (the Serve handle's
            ``process``).
        since_ms: only dead letters written at or after this time (epoch ms).
        where: a CEL expression over the dead letter; only those it holds for.
        dry_run: count, send nothing.
        batch_size: events per dispatch (memory stays bounded whatever the topic's size).
        progress: called after each batch.
        kafka_client: the stack's Kafka connection settings.

    Raises:
        ConfigError: the pipeline has no Kafka dead-letter sink, the filter does not compile,
            or dedupe has no Redis.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    from eventbus.eventing._broker import gap_wait_s
    from eventbus.eventing._kafka_client import kafka_client_kwargs, kafka_connect_error
    from eventbus.eventing.sources._kafka_gaps import OffsetGaps

    spec = config.spec
    dlq_config = spec.dead_letter
    if dlq_config is None or dlq_config.kind != "kafka":
        got = "none" if dlq_config is None else f"a {dlq_config.kind} sink"
        msg = f"pipeline {config.name!r} has {got} as dead_letter; redrive reads a Kafka dead-letter topic (dead_letter: {{kafka: {{topic: ...}}}})"
        raise ConfigError(msg)
    topic: str = dlq_config.options.topic
    bootstrap = dlq_config.options.bootstrap_servers or bootstrap
    predicate = compile_where(where) if where else None
    if not dry_run and not redis_url:
        msg = "redrive dedupes its outputs in Redis: pass --redis-url (or --dry-run)"
        raise ConfigError(msg)
    report = RedriveReport(topic=topic, dry_run=dry_run)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        **kafka_client_kwargs(kafka_client),
    )
    try:
        await consumer.start()
    except (KafkaError, KeyError) as start_error:
        await consumer.stop()
        raise await kafka_connect_error(
            f"redrive of {topic!r}", bootstrap, kafka_client, start_error
        ) from start_error
    try:
        parts = await _partitions(consumer, topic)
        if not parts:
            return report  # the topic was never written: nothing to redrive
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        # The ends the topic has now, so that what this redrive dead-letters again is not
        # read again. Tansu answers ListOffsets with a lower bound (the last batch's base
        # offset), while a fetch response carries the true high watermark: the first one seen
        # per partition (before anything is written) is its end.
        floors = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deliver = None if dry_run else _Delivery(config, bootstrap, redis_url, kafka_client)
        if deliver is not None:
            await deliver.start()
        try:
            ends: dict[Any, int] = {}
            open_parts = set(tps)
            seen: set[bytes] = set()  # 12-byte digests of source + id: ~60 bytes per event
            # Tansu may store concurrent producers' batches out of order: take records only
            # up to a gap in a partition's offsets, and fetch the gap again until it fills
            # (on Apache Kafka every gap is real: nothing waits)
            wait_s = await gap_wait_s(None, bootstrap, kafka_client, on_tansu_s=10.0)
            gaps = OffsetGaps(wait_s, f"redrive of {topic!r}")
            quiet_since = time.monotonic()
            while open_parts:
                data = await consumer.getmany(*open_parts, timeout_ms=200, max_records=batch_size)
                for tp in open_parts - set(ends):
                    hw = consumer.highwater(tp)
                    if hw is not None:
                        ends[tp] = max(hw, floors.get(tp, 0))
                data, _ = gaps.take(consumer, data, time.monotonic())
                batch: list[Item] = []
                for tp, records in data.items():
                    records = [r for r in records if r.offset < ends.get(tp, r.offset + 1)]
                    report.read += len(records)
                    batch.extend(_select(config, records, since_ms, predicate, report, seen))
                for tp in list(open_parts):
                    if tp in ends and await consumer.position(tp) >= ends[tp]:
                        open_parts.discard(tp)
                if data:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since > _STALL_S:
                    msg = f"redrive of {topic!r}: no records came for {_STALL_S:g} s before the end of partitions {sorted(tp.partition for tp in open_parts)}; is the broker up? Run it again: outputs already delivered are deduped"
                    raise ConfigError(msg)
                report.redriven += len(batch)
                if deliver is not None and batch:
                    await deliver.run(batch, dispatch, report)
                if progress is not None:
                    progress(report)
        finally:
            if deliver is not None:
                await deliver.stop()
    finally:
        await consumer.stop()
    return report


Item = tuple[CloudEvent, bytes | None, tuple[str, int, int]]


def _select(
    config: PipelineConfig,
    records: list[Any],
    since_ms: int | None,
    predicate: Callable[[CloudEvent], bool] | None,
    report: RedriveReport,
    seen: set[bytes],
) -> list[Item]:
    """The records to redrive: (event without ``eb*`` attributes, record key, where it had
    failed first: ``ebtopic``, ``ebpartition``, ``eboffset``)."""
    if since_ms is not None:
        kept = [r for r in records if r.timestamp >= since_ms]
        report.before_since += len(records) - len(kept)
        records = kept
    decoded, errors = decode_kafka_records(
        records, default_type="eventbus.message", default_source="eventbus-redrive"
    )
    report.undecodable += len(errors)
    failed = {i for i, _ in errors}
    events = iter(decoded)
    out: list[Item] = []
    for i, record in enumerate(records):
        if i in failed:
            continue
        e = next(events)
        attrs = e.attributes
        if "ebstep" not in attrs:
            report.not_dead_letters += 1
            continue
        if attrs.get("ebpipeline", config.name) != config.name:
            report.other_pipeline += 1
            continue
        if predicate is not None and not predicate(e):
            report.not_matched += 1
            continue
        digest = hashlib.blake2b(f"{e.source}\x00{e.id}".encode(), digest_size=12).digest()
        if digest in seen:
            report.repeats += 1  # dead-lettered again by an earlier redrive: run once
            continue
        seen.add(digest)
        step = str(attrs["ebstep"])
        report.by_step[step] = report.by_step.get(step, 0) + 1
        where = (
            str(attrs.get("ebtopic", "")),
            _int(attrs.get("ebpartition")),
            _int(attrs.get("eboffset")),
        )
        out.append((_strip(e), record.key, where))
    return out


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


class _Delivery:
    """Outputs to the sink through dedupe, failures to the dead-letter sink."""

    def __init__(
        self,
        config: PipelineConfig,
        bootstrap: str,
        redis_url: str | None,
        kafka_client: KafkaClientConfig | None,
    ) -> None:
        from eventbus.eventing._delivery import RedisDeduper
        from eventbus.serving._outputs import make_sink, source_sinks

        spec = config.spec
        assert spec.dead_letter is not None and redis_url
        self._config = config
        # the pipeline's sink, or its named sinks behind its routes (as the sources route)
        self._sinks = source_sinks(
            config,
            lambda cfg: make_sink(cfg, default_bootstrap=bootstrap, default_client=kafka_client),
        )
        routing = self._sinks.routing
        self._outs: dict[str | None, Any] = (
            dict(routing.sinks) if routing is not None else {None: self._sinks.sink}
        )
        self._dlq = self._sinks.dead_letter
        window = spec.delivery.dedupe.window_s if spec.delivery.dedupe else 600.0
        self._dedupe = RedisDeduper(redis_url, config.name, window)

    async def start(self) -> None:
        for sink in self._outs.values():
            await sink.start()
        await self._dlq.start()

    async def stop(self) -> None:
        for sink in self._outs.values():
            await sink.stop()
        await self._dlq.stop()
        await self._dedupe.close()

    async def run(self, items: list[Item], dispatch: Any, report: RedriveReport) -> None:
        from eventbus.eventing.sources._kafka_delivery import dead_letter_event
        from eventbus.serving._outputs import send_deduped

        outcomes: list[Outcome] = await dispatch([e for e, _, _ in items])
        outputs: list[tuple[CloudEvent, bytes | None]] = []
        origins: list[tuple[CloudEvent, str, int, int]] = []  # per output: its input
        dead: list[tuple[CloudEvent, bytes | None]] = []
        for (e, key, (t, p, o)), outcome in zip(items, outcomes):
            if isinstance(outcome, Failure):
                dead.append((dead_letter_event(e, self._config.name, outcome, t, p, o), key))
            elif outcome:
                outputs.extend((out, key) for out in outcome)
                origins.extend((e, t, p, o) for _ in outcome)
            else:
                report.filtered += 1
        shares: dict[str | None, list[tuple[CloudEvent, bytes | None]]] = {None: outputs}
        routing = self._sinks.routing
        if routing is not None:  # routed as the sources route: per sink, deduped per sink
            plan = routing.plan([out for out, _ in outputs])
            shares = {n: [outputs[i] for i, _ in v] for n, v in plan.by_sink.items()}
            report.unrouted += len(plan.unrouted)
            for i, err in plan.errors.items():
                e, t, p, o = origins[i]
                failure = Failure(err.route, "RouteError", str(err))
                dead.append((dead_letter_event(e, self._config.name, failure, t, p, o), None))
        skipped = await asyncio.gather(
            *(send_deduped(self._outs[n], n, share, self._dedupe) for n, share in shares.items())
        )
        if dead:
            await self._dlq.send(dead)
        report.duplicates += sum(skipped)
        report.outputs += sum(len(share) for share in shares.values()) - sum(skipped)
        report.dead_lettered += len(dead)


async def _partitions(consumer: Any, topic: str, wait_s: float = 2.0) -> set[int]:
    deadline = time.monotonic() + wait_s
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return set(parts)
        await refresh_metadata(consumer)
        if time.monotonic() > deadline:
            return set()
        await asyncio.sleep(0.2)
