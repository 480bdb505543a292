"""Where a Kafka sink's topic ends and what its tail holds: the lower bounds of the
partitions' ends (kept current by the sink's acknowledgements, refreshed from the broker) and
the dedupe keys of the records after them, read by a source recovering after a crash.
:class:`~eventbus.eventing.sinks._kafka.KafkaSink` mixes it in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from aiokafka.errors import KafkaError

from eventbus.eventing._aiokafka_adapter import refresh_metadata
from eventbus.eventing._codecs import KafkaRecord
from eventbus.eventing._kafka_client import kafka_client_kwargs
from eventbus.eventing._kafka_live_password import follow_password

if TYPE_CHECKING:
    from eventbus.eventing._kafka_client import KafkaClientConfig
    from eventbus.eventing.sinks._kafka import KafkaSinkConfig

__all__ = ["TailPositions"]

# One logger for the Kafka sink, as when it was one module.
log = logging.getLogger("eventbus.eventing.sinks._kafka")

#: How often the lower bounds of the partitions' ends are refreshed from the broker.
_FLOORS_EVERY_S = 1.0
#: Longest a search of the topic's tail (after a crash) may take before it gives up.
_SCAN_TIMEOUT_S = 120.0


class TailPositions:
    """The partitions' ends and the tail's dedupe keys of :class:`KafkaSink`."""

    config: KafkaSinkConfig
    client: KafkaClientConfig | None
    bootstrap_servers: str
    _client_kwargs: dict[str, Any]
    _floors: dict[int, int]
    _floors_at: float | None
    _floors_task: asyncio.Task[None] | None
    _offsets_consumer: Any

    async def positions(self) -> dict[int, int]:
        """Per partition, an offset at or below where the next record will land.

        Refreshed from the broker at most every second, in the background (the first call
        waits for it); between refreshes the acknowledgements move the bounds forward.
        """
        if self._floors_at is None:
            await self._refresh_floors()
        elif time.monotonic() - self._floors_at > _FLOORS_EVERY_S and (
            self._floors_task is None or self._floors_task.done()
        ):
            self._floors_at = time.monotonic()
            self._floors_task = asyncio.create_task(self._refresh_floors())
        return self._floors

    async def _refresh_floors(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        try:
            if self._offsets_consumer is None:
                consumer = AIOKafkaConsumer(
                    bootstrap_servers=self.bootstrap_servers,
                    group_id=None,
                    enable_auto_commit=False,
                    **self._client_kwargs,
                )
                follow_password(consumer, self.client)
                await consumer.start()
                self._offsets_consumer = consumer
            topic = self.config.topic
            parts = self._offsets_consumer.partitions_for_topic(topic)
            if not parts:
                await refresh_metadata(self._offsets_consumer)
                parts = self._offsets_consumer.partitions_for_topic(topic) or set()
            # ListOffsets answers at or below the end (Tansu: the last batch's base + 1), and
            # records sent after this call land above it: a valid lower bound.
            ends = await self._offsets_consumer.end_offsets(
                [TopicPartition(topic, p) for p in parts]
            )
            floors = dict(self._floors)
            for tp, end in ends.items():
                if end > floors.get(tp.partition, -1):
                    floors[tp.partition] = end
            self._floors = floors
        except KafkaError as e:
            log.warning(
                "kafka sink %s: cannot read the partitions' ends (%s); searches after a crash start further back",
                self.config.topic,
                e,
            )
        finally:
            self._floors_at = time.monotonic()

    async def written_keys(self, positions: dict[int, int]) -> set[str]:
        """The dedupe keys (``source`` + ``id``) of the records at or after ``positions``.

        Reads each partition from its position to the end as it is now. Used after a crash to
        learn which outputs of an unfinished batch the topic already holds.

        Raises:
            TimeoutError: the tail could not be read within two minutes.
        """
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from eventbus.eventing._delivery import dedupe_key

        topic = self.config.topic
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=20,
            **kafka_client_kwargs(self.client),
        )
        await consumer.start()
        found: set[str] = set()
        try:
            tps = [TopicPartition(topic, p) for p in sorted(positions)]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            todo = set()
            for tp in tps:
                # Tansu's end is the last batch's base + 1: reading past it reads that batch
                # whole, which is the true end.
                if positions[tp.partition] < ends[tp]:
                    consumer.seek(tp, positions[tp.partition])
                    todo.add(tp)
            deadline = time.monotonic() + _SCAN_TIMEOUT_S
            while todo:
                if time.monotonic() > deadline:
                    msg = f"kafka sink {topic!r}: reading the tail of {sorted(tp.partition for tp in todo)} took over {_SCAN_TIMEOUT_S:g} s"
                    raise TimeoutError(msg)
                data = await consumer.getmany(*todo, timeout_ms=200, max_records=10_000)
                for records in data.values():
                    for r in records:
                        k = dedupe_key(KafkaRecord(list(r.headers or ()), r.value, r.key))
                        if k is not None:
                            found.add(k)
                for tp in list(todo):
                    if await consumer.position(tp) >= ends[tp]:
                        todo.discard(tp)
        finally:
            await consumer.stop()
        return found
