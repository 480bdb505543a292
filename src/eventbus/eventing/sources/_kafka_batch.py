"""Batches of the Kafka source: fetched records in, one dispatchable batch out.

A batch carries its events (decoded here, or :class:`RawRecord` when decoding happens where
dispatch runs), the record each event came from, the dead letters of the records that did not
decode, and the offsets to commit once all of it was delivered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from eventbus.errors import EventDecodeError
from eventbus.eventing._codecs import RawRecord, decode_kafka_records
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig

__all__ = ["BatchMaker", "KafkaBatch", "Keyed"]

#: An event for a sink, with the Kafka key it goes out with.
Keyed: TypeAlias = "tuple[CloudEvent, bytes | None]"


@dataclass(slots=True)
class KafkaBatch:
    """One dispatched batch of records, from fetch to commit."""

    seq: int
    count: int  # records, decodable or not
    events: list[CloudEvent] | list[RawRecord]  # RawRecord when decode_in_dispatch
    records: list[Any]  # per event: the ConsumerRecord it came from (key, position)
    dead: list[Keyed]  # undecodable records as dead-letter events
    offsets: dict[Any, int]  # next offset to commit, per TopicPartition
    task: asyncio.Task[list[Outcome]] | None = field(default=None)
    delivery: asyncio.Task[None] | None = field(default=None)  # outputs to sinks, not the commit
    oldest_ms: int = 0  # the oldest record's timestamp (end-to-end latency, per batch)


class BatchMaker:
    """Makes numbered batches of fetched records.

    Args:
        config: the source configuration (``type``/``source`` of plain messages).
        decode_in_dispatch: keep the records undecoded (:class:`RawRecord`).
        undecodable: counts and logs a record that did not decode and returns its
            dead-letter event.
    """

    def __init__(
        self,
        config: KafkaSourceConfig,
        decode_in_dispatch: bool,
        undecodable: Callable[[Any, EventDecodeError], Keyed],
    ) -> None:
        self._default_type = config.type
        self._default_source = config.source
        self._raw = decode_in_dispatch
        self._undecodable = undecodable
        self._seq = 0
        #: records found undecodable before the batch (value_format avro), by id(record): set
        #: for one make() call by the source
        self.failed: dict[int, EventDecodeError] = {}

    def make(self, data: dict[Any, list[Any]]) -> KafkaBatch | None:
        """The next batch of ``data`` (records per TopicPartition); None when it has none."""
        events: list[Any] = []
        sources: list[Any] = []  # per event: its record
        dead: list[Keyed] = []
        offsets: dict[Any, int] = {}
        count = 0
        oldest = 0
        for tp, records in data.items():
            if not records:
                continue
            ts = records[0].timestamp
            if ts is not None and ts > 0 and (oldest == 0 or ts < oldest):
                oldest = ts
            count += len(records)
            offsets[tp] = records[-1].offset + 1
            if self.failed:
                failed = self.failed
                dead.extend(self._undecodable(r, failed[id(r)]) for r in records if id(r) in failed)
                records = [r for r in records if id(r) not in failed]
            if self._raw:
                topic, partition = tp.topic, tp.partition
                events.extend(
                    RawRecord(r.value, r.headers, r.key, topic, partition, r.offset)
                    for r in records
                )
                sources.extend(records)
                continue
            decoded, errors = decode_kafka_records(
                records, default_type=self._default_type, default_source=self._default_source
            )
            events.extend(decoded)
            if not errors:
                sources.extend(records)
                continue
            bad = set()
            for i, error in errors:
                bad.add(i)
                dead.append(self._undecodable(records[i], error))
            sources.extend(r for i, r in enumerate(records) if i not in bad)
        if not count:
            return None
        self._seq += 1
        return KafkaBatch(self._seq, count, events, sources, dead, offsets, oldest_ms=oldest)
