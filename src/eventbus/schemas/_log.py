"""Where the registry's records live: a compacted Kafka topic (``_schemas``), or memory.

:class:`KafkaSchemaLog` replays the topic from its start when it starts, then keeps reading
it (so a server sees what the others wrote); an append returns once this server has read its
own record back, so a write is visible here when its request is answered, and a restart
rebuilds the same state from the topic.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from eventbus.eventing import KafkaClientConfig
from eventbus.schemas._errors import SchemaRegistryError
from eventbus.schemas._state import RegistryState

__all__ = ["SCHEMAS_TOPIC", "KafkaSchemaLog", "MemorySchemaLog"]

log = logging.getLogger("eventbus.schemas")

SCHEMAS_TOPIC = "_schemas"


class MemorySchemaLog:
    """Records applied in memory (unit tests, a registry that needs no durability).

    Example:
        >>> MemorySchemaLog().state.subjects()
        []
    """

    def __init__(self) -> None:
        self.state = RegistryState()
        self.records: list[tuple[bytes, bytes | None]] = []

    async def append(self, key: bytes, value: bytes | None) -> None:
        self.records.append((key, value))
        self.state.apply(key, value)

    async def catch_up(self) -> None:
        return None


class KafkaSchemaLog:
    """The registry's records in a compacted Kafka topic, replayed on :meth:`start`.

    Args:
        bootstrap: the brokers.
        topic: the topic (created compacted, one partition, when missing).
        client: TLS/SASL settings; None: plaintext.
        replication_factor: copies of the topic's partition when it is created; None: three,
            or as many as the cluster has brokers when fewer.
        timeout_s: how long a write or a catch-up may wait for the broker.

    Example:
        >>> KafkaSchemaLog("127.0.0.1:9092").topic
        '_schemas'
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        topic: str = SCHEMAS_TOPIC,
        client: KafkaClientConfig | None = None,
        replication_factor: int | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.client = client
        self.replication_factor = replication_factor
        self.timeout_s = timeout_s
        self.state = RegistryState()
        self._position = 0  # the next offset to apply
        self._moved = asyncio.Condition()
        self._producer: Any = None
        self._consumer: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Create the topic if missing, connect, and replay it to its end."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        from eventbus.eventing._kafka_client import kafka_client_kwargs

        await self._ensure_topic()
        kwargs = kafka_client_kwargs(self.client)
        self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", **kwargs)
        await self._producer.start()
        self._tp = TopicPartition(self.topic, 0)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **kwargs,
        )
        await self._consumer.start()
        self._consumer.assign([self._tp])
        await self._consumer.seek_to_beginning(self._tp)
        self._reader = asyncio.create_task(self._read_forever())
        await self.catch_up()
        log.info("schema registry: replayed %d records of %s", self._position, self.topic)

    async def _ensure_topic(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        from eventbus.eventing._kafka_client import kafka_client_kwargs

        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap,
            request_timeout_ms=int(self.timeout_s * 1000),
            **kafka_client_kwargs(self.client),
        )
        try:
            await admin.start()
        except BaseException:
            await admin.close()
            raise
        try:
            if self.topic in set(await admin.list_topics()):
                return
            copies = self.replication_factor
            if copies is None:
                copies = min(3, len((await admin.describe_cluster()).get("brokers") or [1]))
            topic = NewTopic(
                self.topic,
                1,
                copies,
                topic_configs={"cleanup.policy": "compact"},
            )
            try:
                response = await admin.create_topics([topic])
            except TopicAlreadyExistsError:
                return  # another server created it meanwhile
            for name, code, *_ in response.topic_errors:
                if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS
                    msg = f"the broker refused to create the schema topic {name!r}: error {code}"
                    raise SchemaRegistryError(500, 50001, msg)
        finally:
            await admin.close()

    async def _read_forever(self) -> None:
        while True:
            try:
                batches = await self._consumer.getmany(self._tp, timeout_ms=500)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - keep reading; writes wait meanwhile
                log.warning("schema registry: reading %s failed: %s", self.topic, e)
                await asyncio.sleep(0.5)
                continue
            for record in batches.get(self._tp, []):
                self.state.apply(record.key, record.value)
                self._position = record.offset + 1
            # past compacted gaps too (the next offset to be returned)
            position = await self._consumer.position(self._tp)
            if position != self._position or batches:
                self._position = max(self._position, position)
                async with self._moved:
                    self._moved.notify_all()

    async def _wait_for(self, offset: int, what: str) -> None:
        """Until the records before ``offset`` are applied."""

        async def reached() -> None:
            async with self._moved:
                await self._moved.wait_for(lambda: self._position >= offset)

        try:
            await asyncio.wait_for(reached(), self.timeout_s)
        except TimeoutError as e:
            msg = (
                f"{what}: the schema topic {self.topic!r} on {self.bootstrap} was not read up to "
                f"offset {offset} within {self.timeout_s:g} s; is the broker up?"
            )
            raise SchemaRegistryError(500, 50002, msg) from e

    async def catch_up(self) -> None:
        """Apply every record written before this call (other servers' writes included)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while True:  # a topic just created may be unknown to the broker's metadata a moment
            try:
                ends = await asyncio.wait_for(
                    self._consumer.end_offsets([self._tp]), max(0.1, deadline - loop.time())
                )
                break
            except Exception as e:  # any failure of the broker: named in the error
                if loop.time() >= deadline:
                    msg = (
                        f"reading the end of the schema topic {self.topic!r} on "
                        f"{self.bootstrap} failed: {type(e).__name__}: {e}"
                    )
                    raise SchemaRegistryError(500, 50001, msg) from e
                await asyncio.sleep(0.1)
        await self._wait_for(int(ends[self._tp]), "catching up")

    async def append(self, key: bytes, value: bytes | None) -> None:
        """Write one record and wait until this server has applied it."""
        try:
            meta = await asyncio.wait_for(
                self._producer.send_and_wait(self.topic, value=value, key=key, partition=0),
                self.timeout_s,
            )
        except Exception as e:  # any failure of the broker or of fastavro: named in the error
            msg = f"writing to the schema topic {self.topic!r} on {self.bootstrap} failed: {e}"
            raise SchemaRegistryError(500, 50001, msg) from e
        await self._wait_for(meta.offset + 1, "writing")

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
