"""``value_format: avro`` and ``json_schema`` of the Kafka source: Confluent-framed values
(Avro, or JSON validated against its JSON Schema) become JSON
before the batch is made, so every later path (batches, the replicas' decoding, dead
letters) sees the plain JSON messages it knows.

Writer schemas are fetched from the registry once per id (``AvroWireDecoder``,
``JsonSchemaWireDecoder``). A record that
cannot be decoded is handed back with its error, for a dead letter that names why; a registry
that cannot be reached holds the fetched records (retried with backoff, never dead-lettered)
until it answers or the source stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from eventbus.errors import EventDecodeError
from eventbus.eventing._confluent_avro import (
    AvroWireDecoder,
    RegistryUnavailableError,
    WireDecoder,
)
from eventbus.eventing.sources._kafka_batch import BatchMaker
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig

__all__ = ["AvroTranscoder"]

log = logging.getLogger("eventbus.eventing")

_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class AvroTranscoder:
    """Turn fetched Avro (or JSON Schema) records' values into JSON, in place.

    Args:
        registry_url: the schema registry.
        pipeline: named in the logs.
        stopping: True once the source stops (a wait for the registry ends then).
        decoder: the format's decoder (default: Avro's of ``registry_url``).
    """

    def __init__(
        self,
        registry_url: str,
        pipeline: str,
        stopping: Callable[[], bool],
        decoder: WireDecoder | None = None,
    ) -> None:
        self.decoder = decoder or AvroWireDecoder(registry_url)
        self.pipeline = pipeline
        self._stopping = stopping
        self.registry_waits = 0  # fetches held because the registry could not be reached

    @classmethod
    def of(
        cls, config: KafkaSourceConfig, pipeline: str, stopping: Callable[[], bool]
    ) -> AvroTranscoder | None:
        """The transcoder of a source with ``value_format: avro`` or ``json_schema``; None
        for json."""
        url = config.schema_registry_url
        if config.value_format == "json" or url is None:
            return None
        if config.value_format == "json_schema":
            from eventbus.eventing._confluent_json import JsonSchemaWireDecoder

            return cls(url, pipeline, stopping, JsonSchemaWireDecoder(url))
        return cls(url, pipeline, stopping)

    async def transcode(self, data: dict[Any, list[Any]]) -> dict[int, EventDecodeError] | None:
        """Rewrite each record's value as JSON; the undecodable ones by ``id(record)``.

        Returns None when the source stopped while the registry was down (the records are
        then not delivered, nor committed: the partition's next owner fetches them again).
        """
        values = [r.value for records in data.values() for r in records]
        attempt = 0
        while True:
            try:
                await self.decoder.prepare(values)
                break
            except RegistryUnavailableError as e:
                if self._stopping():
                    return None
                self.registry_waits += 1
                delay = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
                attempt += 1
                log.warning(
                    "pipeline %s: kafka source waits for the schema registry (%s); retrying in "
                    "%.1f s",
                    self.pipeline,
                    e,
                    delay,
                )
                await asyncio.sleep(delay)
        failed: dict[int, EventDecodeError] = {}
        decode, kind = self.decoder.json_value, self.decoder.kind
        for records in data.values():
            for r in records:
                try:
                    r.value = decode(r.value)
                except EventDecodeError as e:
                    where = f"{r.topic}[{r.partition}]@{r.offset}"
                    failed[id(r)] = EventDecodeError(f"{where}: {kind} value: {e}")
                except TypeError as e:  # a datum JSON cannot hold (should not happen)
                    failed[id(r)] = EventDecodeError(f"{kind} value as JSON: {e}")
        return failed

    async def into(self, data: dict[Any, list[Any]], batches: BatchMaker) -> bool:
        """Transcode ``data`` and hand its undecodable records to ``batches`` (dead letters
        of its next batch); False: the source stopped while the registry was down."""
        failed = await self.transcode(data)
        if failed is None:
            return False
        batches.failed = failed
        return True

    async def aclose(self) -> None:
        await self.decoder.aclose()
