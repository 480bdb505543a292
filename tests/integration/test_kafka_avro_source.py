"""A Kafka source with ``value_format: avro``: records written by confluent-kafka's
AvroSerializer (two versions of a schema) become events whose data is the datum; a wrong
magic byte, an unknown schema id and truncated or overlong bodies are dead-lettered with the
reason while their batch-mates go on; a registry that is down holds the records (none is
dead-lettered for the outage) until it answers."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.eventing.sinks import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources import (
    DECODE_ERROR_TYPE,
    FetchSettings,
    KafkaSource,
    KafkaSourceConfig,
    SourceSinks,
)
from eventbus.schemas import kafka_registry_app
from tests.integration.registry_helpers import Served
from tests.integration.test_kafka_source import (
    committed_offsets,
    decode_record,
    produce,
    read_all,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

V1 = {"type": "record", "name": "Payment", "fields": [{"name": "amount", "type": "int"}]}
V2 = {
    "type": "record",
    "name": "Payment",
    "fields": [
        {"name": "amount", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "raw", "type": "bytes", "default": ""},
    ],
}


def avro_source(bootstrap: str, topic: str, registry_url: str, out: str, dlq: str) -> KafkaSource:
    async def identity(events: list[CloudEvent]) -> list[Outcome]:
        return [[e] for e in events]

    config = KafkaSourceConfig(
        topic=topic, type="payment", value_format="avro", schema_registry_url=registry_url
    )
    return KafkaSource(
        config,
        pipeline=f"p-{topic}",
        bootstrap_servers=bootstrap,
        dispatch=identity,
        sinks=SourceSinks(
            sink=KafkaSink(KafkaSinkConfig(topic=out), bootstrap_servers=bootstrap),
            dead_letter=KafkaSink(
                KafkaSinkConfig(topic=dlq, mode="structured"), bootstrap_servers=bootstrap
            ),
        ),
        fetch=FetchSettings(session_timeout_ms=6000),
    )


def serialized(registry_url: str, topic: str) -> tuple[list[bytes], int]:
    """Values written by confluent-kafka's AvroSerializer (v1, then v2 after an evolution)."""
    with SchemaRegistryClient({"url": registry_url}) as client:
        ctx = SerializationContext(topic, MessageField.VALUE)
        v1 = AvroSerializer(client, json.dumps(V1))
        v2 = AvroSerializer(client, json.dumps(V2))
        values = [v1({"amount": 5}, ctx), v2({"amount": 2**40, "note": "big", "raw": b"\x01"}, ctx)]
    return values, int.from_bytes(values[1][1:5], "big")


async def test_avro_records_become_events_and_broken_ones_dead_letters(
    kafka_bootstrap: str, topic_factory: Any
) -> None:
    src, out, dlq = (topic_factory(p) for p in ("in", "out", "dlq"))
    registry = Served(kafka_registry_app(kafka_bootstrap, topic=f"_schemas-{uuid.uuid4().hex[:8]}"))
    try:
        (good1, good2), v2_id = await asyncio.to_thread(serialized, registry.url, src)
        broken = [
            b"\x01" + good1[1:],  # offset 2: another magic byte
            b"\x00" + (4242).to_bytes(4, "big") + b"\x02",  # 3: an id the registry lacks
            good2[:-3],  # 4: truncated
            good1 + b"\x00\x00",  # 5: bytes after the datum
            b"\x00\x00",  # 6: shorter than the header
        ]
        values = [good1, good2, *broken, good2]
        await produce(kafka_bootstrap, src, [(0, None, v, []) for v in values])
        source = avro_source(kafka_bootstrap, src, registry.url, out, dlq)
        await source.start()
        runner = asyncio.create_task(source.run())
        try:
            await wait_for(
                lambda: source.stats()["committed"] >= len(values), 30, lambda: str(source.stats())
            )
        finally:
            await source.stop()
            await runner
    finally:
        registry.stop()
    stats = source.stats()
    assert (stats["outputs"], stats["dead_lettered"], stats["registry_waits"]) == (3, 5, 0)
    events = [decode_record(r) for r in await read_all(kafka_bootstrap, out, 3)]
    assert [e.data for e in events] == [
        {"amount": 5},
        {"amount": 2**40, "note": "big", "raw": "AQ=="},
        {"amount": 2**40, "note": "big", "raw": "AQ=="},
    ]
    assert {e.type for e in events} == {"payment"}
    dead = [decode_record(r) for r in await read_all(kafka_bootstrap, dlq, 5)]
    assert [e.type for e in dead] == [DECODE_ERROR_TYPE] * 5
    assert [e["eboffset"] for e in dead] == [2, 3, 4, 5, 6]
    assert [e.data for e in dead] == broken  # the raw record, for a redrive
    errors = [e["eberror"] for e in dead]
    assert errors[0].startswith(f"{src}[0]@2: Avro value: magic byte 1 is not")
    assert "schema id 4242 is not in the registry" in errors[1] and "40403" in errors[1]
    assert f"does not match schema id {v2_id}" in errors[2]
    assert "ends after" in errors[3]
    assert "shorter than the 5-byte Confluent header" in errors[4]
    assert await committed_offsets(kafka_bootstrap, source.group, src, 1) == {0: len(values)}


async def test_records_wait_while_the_registry_is_down(
    kafka_bootstrap: str, topic_factory: Any
) -> None:
    src, out, dlq = (topic_factory(p) for p in ("in", "out", "dlq"))
    schemas_topic = f"_schemas-{uuid.uuid4().hex[:8]}"
    first = Served(kafka_registry_app(kafka_bootstrap, topic=schemas_topic))
    try:
        (good1, good2), _ = await asyncio.to_thread(serialized, first.url, src)
    finally:
        first.stop()
    # the registry's address is bound but nobody listens: connections are refused
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    await produce(kafka_bootstrap, src, [(0, None, good1, []), (0, None, good2, [])])
    source = avro_source(kafka_bootstrap, src, url, out, dlq)
    await source.start()
    runner = asyncio.create_task(source.run())
    later: Served | None = None
    try:
        await wait_for(
            lambda: source.stats()["registry_waits"] >= 2, 30, lambda: str(source.stats())
        )
        assert source.stats()["dead_lettered"] == source.stats()["committed"] == 0
        later = await asyncio.to_thread(
            Served, kafka_registry_app(kafka_bootstrap, topic=schemas_topic), "on", sock
        )
        await wait_for(lambda: source.stats()["committed"] >= 2, 30, lambda: str(source.stats()))
    finally:
        await source.stop()
        await runner
        if later is not None:
            later.stop()
        sock.close()
    assert (source.stats()["outputs"], source.stats()["dead_lettered"]) == (2, 0)
