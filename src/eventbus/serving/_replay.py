"""Replay: re-run a range of a topic through a deployed pipeline (``eventbus replay``).

The range is read with a plain consumer (manual assignment, no group: nothing is committed
and the pipeline's own consumers are not disturbed), dispatched in batches to the pipeline's
Serve application, and delivered like the pipeline delivers: outputs to its sink, failures to
its dead-letter sink with the ``eb*`` attributes, with or without dedupe against what the sink
already received.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eventbus.errors import ConfigError
from eventbus.eventing._aiokafka_adapter import refresh_metadata
from eventbus.eventing._codecs import decode_kafka_records
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing._outcome import Failure, Outcome
from eventbus.pipelines._config import PipelineConfig

__all__ = ["ReplayRange", "parse_time_arg", "replay"]


def parse_time_arg(value: str) -> int:
    """Milliseconds since the epoch from an RFC 3339 time or a number of epoch milliseconds.

    Raises:
        ConfigError: neither form.
    """
    if value.isdigit():
        return int(value)
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        msg = f"time {value!r} is neither RFC 3339 (2024-05-01T12:00:00Z) nor epoch milliseconds"
        raise ConfigError(msg) from None
    if dt.tzinfo is None:
        msg = f"time {value!r} has no offset; add Z or +08:00"
        raise ConfigError(msg)
    return int(dt.timestamp() * 1000)


@dataclass
class ReplayRange:
    """Which records to replay: offsets ``[from_offset, to_offset)`` and/or record times
    ``[from_time_ms, to_time_ms)``, on ``partitions`` (None: all); open ends run to the
    start and the current end."""

    from_offset: int | None = None
    to_offset: int | None = None
    from_time_ms: int | None = None
    to_time_ms: int | None = None
    partitions: list[int] | None = None

    def check(self) -> None:
        if self.from_offset is not None and self.from_time_ms is not None:
            msg = "give --from-offset or --from-time, not both"
            raise ConfigError(msg)
        if self.from_offset is None and self.from_time_ms is None:
            msg = "give where to start: --from-offset N or --from-time 2024-05-01T12:00:00Z"
            raise ConfigError(msg)
        if (
            self.from_offset is not None
            and self.to_offset is not None
            and self.to_offset <= self.from_offset
        ):
            msg = f"--to-offset {self.to_offset} is not after --from-offset {self.from_offset}"
            raise ConfigError(msg)

    def admits(self, offset: int, timestamp: int) -> bool | None:
        """True: replay it; False: skip it; None: past the end of the range."""
        if self.to_offset is not None and offset >= self.to_offset:
            return None
        if self.to_time_ms is not None and timestamp >= self.to_time_ms:
            return None
        if self.from_offset is not None and offset < self.from_offset:
            return False
        return not (self.from_time_ms is not None and timestamp < self.from_time_ms)


@dataclass
class ReplayStats:
    read: int = 0
    replayed: int = 0
    outputs: int = 0
    dropped: int = 0
    dead_lettered: int = 0
    duplicates: int = 0
    per_partition: dict[int, int] = field(default_factory=dict)


async def replay(
    config: PipelineConfig,
    topic: str,
    rng: ReplayRange,
    *,
    bootstrap: str,
    redis_url: str | None,
    dispatch: Callable[[list[CloudEvent]], Any],
    dedupe: bool = True,
    batch_size: int = 1000,
    idle_s: float = 1.0,
    progress: Callable[[ReplayStats], None] | None = None,
    kafka_client: KafkaClientConfig | None = None,
) -> ReplayStats:
    """Replay ``rng`` of ``topic`` through a pipeline.

    Args:
        config: the deployed pipeline.
        topic: the topic to read.
        rng: the range.
        bootstrap: the Kafka bootstrap servers.
        redis_url: Redis, for dedupe.
        dispatch: ``await dispatch(events)`` gives one outcome per event (the Serve handle's
            ``process``).
        dedupe: skip outputs the sink already received (by source + id, the pipeline's
            dedupe window; 600 s when the pipeline sets none).
        batch_size: events per dispatch.
        idle_s: an open-ended range ends after this long without records.
        progress: called after each batch.
        kafka_client: the stack's Kafka connection settings (TLS, SASL); None: plaintext.

    Raises:
        ConfigError: the range is invalid or the topic does not exist.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    from eventbus.eventing._delivery import RedisDeduper
    from eventbus.eventing._kafka_client import kafka_client_kwargs, kafka_connect_error
    from eventbus.eventing.sources._kafka_delivery import dead_letter_event
    from eventbus.serving._outputs import make_sink, send_deduped, source_sinks

    rng.check()
    spec = config.spec
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **kafka_client_kwargs(kafka_client),
    )
    try:
        await consumer.start()
    except (KafkaError, KeyError) as start_error:  # KeyError: aiokafka SCRAM, login refused
        await consumer.stop()
        raise await kafka_connect_error(
            f"replay of {topic!r}", bootstrap, kafka_client, start_error
        ) from start_error
    sinks = source_sinks(
        config,
        lambda cfg: make_sink(cfg, default_bootstrap=bootstrap, default_client=kafka_client),
    )
    outs = sinks.routing.sinks if sinks.routing is not None else {None: sinks.sink}
    dlq = sinks.dead_letter
    deduper = None
    if dedupe:
        if not redis_url:
            msg = "dedupe needs Redis: pass --redis-url or use --no-dedupe"
            raise ConfigError(msg)
        window = spec.delivery.dedupe.window_s if spec.delivery.dedupe else 600.0
        deduper = RedisDeduper(redis_url, config.name, window)
    stats = ReplayStats()
    try:
        parts = sorted(await _partitions(consumer, topic))
        if rng.partitions is not None:
            unknown = sorted(set(rng.partitions) - set(parts))
            if unknown:
                msg = f"topic {topic!r} has no partition {unknown[0]} (it has {len(parts)})"
                raise ConfigError(msg)
            parts = sorted(rng.partitions)
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        for tp in tps:
            # From a time: scan from the start (offset 0, or the earliest retained through
            # auto_offset_reset), since ListOffsets by time is not served by every broker.
            consumer.seek(tp, rng.from_offset if rng.from_offset is not None else 0)
        for sink in outs.values():
            await sink.start()
        if dlq is not None:
            await dlq.start()
        open_parts = set(tps)
        # Plain messages get the type/source of the pipeline's source for this topic, if any.
        own = next((c for c in config.consumed_sources if topic in c.topics), None)
        default_type = own.type if own is not None else "eventbus.message"
        default_source = own.source if own is not None else None  # None: kafka://{topic}
        idle_since = time.monotonic()
        while open_parts:
            data = await consumer.getmany(*open_parts, timeout_ms=200, max_records=batch_size)
            if not data:
                if time.monotonic() - idle_since > idle_s:
                    break
                continue
            idle_since = time.monotonic()
            events: list[CloudEvent] = []
            where: list[tuple[str, int, int, bytes | None]] = []
            dead: list[tuple[CloudEvent, bytes | None]] = []
            for tp, records in data.items():
                admitted = []
                for r in records:
                    stats.read += 1
                    verdict = rng.admits(r.offset, r.timestamp)
                    if verdict is None:
                        open_parts.discard(tp)
                        break
                    if verdict:
                        admitted.append(r)
                decoded, errors = decode_kafka_records(
                    admitted, default_type=default_type, default_source=default_source
                )
                undecodable = dict(errors)
                decoded_events = iter(decoded)  # one per admitted record that decoded
                for i, r in enumerate(admitted):
                    exc = undecodable.get(i)
                    if exc is not None:
                        failure = Failure("decode", "EventDecodeError", str(exc))
                        raw = CloudEvent(
                            {
                                "specversion": "1.0",
                                "id": f"{tp.topic}-{tp.partition}-{r.offset}",
                                "source": f"kafka://{tp.topic}",
                                "type": "eventbus.decode_error",
                            },
                            r.value,
                        )
                        dead.append(
                            (
                                dead_letter_event(
                                    raw, config.name, failure, tp.topic, tp.partition, r.offset
                                ),
                                r.key,
                            )
                        )
                        continue
                    events.append(next(decoded_events))
                    where.append((tp.topic, tp.partition, r.offset, r.key))
                    stats.per_partition[tp.partition] = stats.per_partition.get(tp.partition, 0) + 1
            outcomes: list[Outcome] = await dispatch(events) if events else []
            outputs: list[tuple[CloudEvent, bytes | None]] = []
            origins: list[tuple[CloudEvent, str, int, int]] = []  # per output: its input
            for e, (t, p, o, key), outcome in zip(events, where, outcomes):
                if isinstance(outcome, Failure):
                    dead.append((dead_letter_event(e, config.name, outcome, t, p, o), key))
                elif outcome:
                    outputs.extend((out, key) for out in outcome)
                    origins.extend((e, t, p, o) for _ in outcome)
                else:
                    stats.dropped += 1
            shares: dict[str | None, list[tuple[CloudEvent, bytes | None]]] = {None: outputs}
            if sinks.routing is not None:
                plan = sinks.routing.plan([o for o, _ in outputs])
                shares = {n: [outputs[i] for i, _ in v] for n, v in plan.by_sink.items()}
                stats.dropped += len(plan.unrouted)  # no route took them
                for i, err in plan.errors.items():
                    failure = Failure(err.route, "RouteError", str(err))
                    e, t, p, o = origins[i]
                    letter = dead_letter_event(e, config.name, failure, t, p, o)
                    dead.append((letter, outputs[i][1]))
            sends = [send_deduped(outs[n], n, share, deduper) for n, share in shares.items()]
            if dlq is not None and dead:
                sends.append(dlq.send(dead))
            done = await asyncio.gather(*sends)
            skipped = sum(done[: len(shares)])  # send_deduped: outputs the sink had already
            stats.duplicates += skipped
            stats.replayed += len(events)
            stats.outputs += sum(len(share) for share in shares.values()) - skipped
            stats.dead_lettered += len(dead) if dlq is not None else 0
            if progress is not None:
                progress(stats)
    finally:
        await consumer.stop()
        for sink in outs.values():
            await sink.stop()
        if dlq is not None:
            await dlq.stop()
        if deduper is not None:
            await deduper.close()
    return stats


async def _partitions(consumer: Any, topic: str) -> set[int]:
    deadline = time.monotonic() + 10
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return set(parts)
        await refresh_metadata(consumer)
        if time.monotonic() > deadline:
            msg = f"topic {topic!r} does not exist on the broker; check the name (`eventbus tail {topic}` reads it)"
            raise ConfigError(msg)
        await asyncio.sleep(0.2)
