"""Avro through a deployed pipeline on Apache Kafka: confluent-kafka's AvroSerializer writes the
input, a filter + convert pipeline (source and sink ``value_format: avro``) runs on Ray Serve,
and confluent-kafka's AvroDeserializer reads the output back; a record that does not fit the
sink's schema is dead-lettered with the reason; an incompatible sink schema, or a pinned
version the subject lacks, is refused at deploy with the registry's reason."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from eventbus.errors import DeployError
from eventbus.schemas import kafka_registry_app
from tests.integration.registry_helpers import Served
from tests.integration.test_kafka_source import decode_record, produce, read_all

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

PAYMENT = {
    "type": "record",
    "name": "Payment",
    "fields": [
        {"name": "amount", "type": "long"},
        {"name": "currency", "type": ["null", "string"], "default": None},
    ],
}
LARGE = {
    "type": "record",
    "name": "Large",
    "namespace": "shop",
    "fields": [
        {"name": "amount", "type": "long"},
        {"name": "currency", "type": "string"},
        {"name": "amount_cny", "type": "long"},
    ],
}


@pytest.fixture(scope="module")
def registry_url(kafka_bootstrap: str) -> Iterator[str]:
    served = Served(kafka_registry_app(kafka_bootstrap, topic=f"_schemas-{uuid.uuid4().hex[:8]}"))
    try:
        yield served.url
    finally:
        served.stop()


def pipeline(name: str, src: str, out: str, dlq: str, url: str, sink: dict[str, Any]) -> Any:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [
                {
                    "kafka": {
                        "topic": src,
                        "type": "payment",
                        "value_format": "avro",
                        "schema_registry_url": url,
                    }
                }
            ],
            "steps": [
                {"id": "large", "filter": "data.amount > 100"},
                {"id": "cny", "convert": {"set": {"data.amount_cny": "data.amount * 7"}}},
            ],
            "sink": {
                "kafka": {
                    "topic": out,
                    "value_format": "avro",
                    "schema_registry_url": url,
                    **sink,
                }
            },
            "dead_letter": {"kafka": {"topic": dlq}},
            "serving": {"replicas": 1},
        },
    }


def serialize(url: str, topic: str, data: list[dict[str, Any]]) -> list[bytes]:
    with SchemaRegistryClient({"url": url}) as client:
        ser = AvroSerializer(client, json.dumps(PAYMENT))
        ctx = SerializationContext(topic, MessageField.VALUE)
        return [ser(d, ctx) for d in data]


def deserialize(url: str, topic: str, values: list[bytes]) -> list[Any]:
    with SchemaRegistryClient({"url": url}) as client:
        de = AvroDeserializer(client)
        ctx = SerializationContext(topic, MessageField.VALUE)
        return [de(v, ctx) for v in values]


def test_avro_in_filter_convert_avro_out(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, registry_url: str
) -> None:
    src, out, dlq = (topic_factory(p) for p in ("avro-in", "avro-out", "avro-dlq"))
    payments = [
        {"amount": 5, "currency": "EUR"},  # filtered out
        {"amount": 500, "currency": "EUR"},
        {"amount": 2**40, "currency": "USD"},
        {"amount": 3000, "currency": None},  # passes the filter, does not fit Large
        {"amount": 1000, "currency": "GBP"},
    ]
    values = serialize(registry_url, src, payments)
    asyncio.run(produce(kafka_bootstrap, src, [(0, None, v, []) for v in values]))
    subject = f"{out}-value"
    deploy_pipeline(
        pipeline(f"avro-{uuid.uuid4().hex[:8]}", src, out, dlq, registry_url, {
            "subject": subject, "value_schema": LARGE,
        })
    )  # fmt: skip
    records = asyncio.run(read_all(kafka_bootstrap, out, 3, timeout_s=90))
    assert all(r.value[0] == 0 for r in records)  # the Confluent wire format
    got = deserialize(registry_url, out, [r.value for r in records])
    assert got == [
        {"amount": 500, "currency": "EUR", "amount_cny": 3500},
        {"amount": 2**40, "currency": "USD", "amount_cny": 7 * 2**40},
        {"amount": 1000, "currency": "GBP", "amount_cny": 7000},
    ]
    assert dict(records[0].headers)["ce_type"] == b"payment"
    (dead,) = [decode_record(r) for r in asyncio.run(read_all(kafka_bootstrap, dlq, 1, 60))]
    reason = dead["eberror"]
    assert f"subject {subject!r}" in reason and "Large.currency" in reason, reason
    assert "expected string" in reason, reason
    assert dead.data == {"amount": 3000, "currency": None}  # the input, for a redrive


def test_incompatible_or_unknown_sink_schemas_are_refused_at_deploy(
    eventbus_client: Any,
    topic_factory: Any,
    registry_url: str,
    tmp_path: Path,
) -> None:
    src, out, dlq = (topic_factory(p) for p in ("ref-in", "ref-out", "ref-dlq"))
    subject = f"{out}-value"
    with SchemaRegistryClient({"url": registry_url}) as client:
        from confluent_kafka.schema_registry import Schema

        client.register_schema(subject, Schema(json.dumps(LARGE), "AVRO"))
    # BACKWARD (the default): a new field without a default cannot read the old data
    changed = dict(LARGE, fields=[*LARGE["fields"], {"name": "country", "type": "string"}])
    cases = [
        (
            {"subject": subject, "value_schema": changed},
            [f"spec.sink.kafka.value_schema: incompatible with subject {subject!r}", "country"],
        ),
        (
            {"subject": subject, "version": 9},
            [f"spec.sink.kafka.version: subject {subject!r} version 9 is not in", "40402"],
        ),
    ]
    for sink, expect in cases:
        doc = pipeline(f"ref-{uuid.uuid4().hex[:6]}", src, out, dlq, registry_url, sink)
        path = tmp_path / f"{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        with pytest.raises(DeployError) as info:
            eventbus_client.deploy(path)
        msg = str(info.value)
        assert all(e in msg for e in expect), msg
        assert doc["metadata"]["name"] not in [p["name"] for p in eventbus_client.list()]
    with SchemaRegistryClient({"url": registry_url}) as client:
        assert client.get_versions(subject) == [1]  # the refused schema was not registered


async def test_the_sink_itself_encodes_and_dead_letters_what_does_not_fit(
    kafka_bootstrap: str, topic_factory: Any, registry_url: str
) -> None:
    """The source's own sink path (not a replica's encoding): the sink learns its schema id on
    the first send; the event that does not fit is dead-lettered, its batch-mates written."""
    from eventbus.eventing._event import CloudEvent
    from eventbus.eventing._outcome import Outcome
    from eventbus.eventing.sinks import KafkaSink, KafkaSinkConfig
    from eventbus.eventing.sources import FetchSettings, KafkaSource, KafkaSourceConfig, SourceSinks
    from tests.integration.test_kafka_source import wait_for

    src, out, dlq = (topic_factory(p) for p in ("own-in", "own-out", "own-dlq"))

    async def to_large(events: list[CloudEvent]) -> list[Outcome]:
        return [[e.replace(data={**e.data, "amount_cny": e.data["amount"] * 7})] for e in events]

    payments = [{"amount": 1, "currency": "EUR"}, {"amount": 2}, {"amount": 3, "currency": "X"}]
    values = await asyncio.to_thread(serialize, registry_url, src, payments)
    await produce(kafka_bootstrap, src, [(0, None, v, []) for v in values])
    sink = KafkaSinkConfig(
        topic=out,
        value_format="avro",
        schema_registry_url=registry_url,
        subject=f"{out}-value",
        value_schema=LARGE,
    )
    source = KafkaSource(
        KafkaSourceConfig(
            topic=src, type="payment", value_format="avro", schema_registry_url=registry_url
        ),
        pipeline=f"p-{src}",
        bootstrap_servers=kafka_bootstrap,
        dispatch=to_large,
        sinks=SourceSinks(
            sink=KafkaSink(sink, bootstrap_servers=kafka_bootstrap),
            dead_letter=KafkaSink(KafkaSinkConfig(topic=dlq), bootstrap_servers=kafka_bootstrap),
        ),
        fetch=FetchSettings(session_timeout_ms=6000),
    )
    await source.start()
    runner = asyncio.create_task(source.run())
    try:
        await wait_for(lambda: source.stats()["committed"] >= 3, 30, lambda: str(source.stats()))
    finally:
        await source.stop()
        await runner
    records = await read_all(kafka_bootstrap, out, 2)
    got = await asyncio.to_thread(deserialize, registry_url, out, [r.value for r in records])
    assert got == [
        {"amount": 1, "currency": "EUR", "amount_cny": 7},
        {"amount": 3, "currency": "X", "amount_cny": 21},
    ]
    (dead,) = [decode_record(r) for r in await read_all(kafka_bootstrap, dlq, 1)]
    assert "Field(shop.Large.currency) is None expected string" in dead["eberror"], dead["eberror"]


ORDER_JSON = {
    "type": "object",
    "properties": {"amount": {"type": "integer"}, "currency": {"type": ["string", "null"]}},
    "required": ["amount"],
}
LARGE_JSON = {
    "type": "object",
    "properties": {
        "amount": {"type": "integer"},
        "currency": {"type": "string"},
        "amount_cny": {"type": "integer"},
    },
    "required": ["amount", "currency", "amount_cny"],
}


def test_json_schema_in_filter_convert_json_schema_out(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, registry_url: str
) -> None:
    """value_format json_schema on both sides: confluent-kafka's JSONSerializer writes, its
    JSONDeserializer reads back; a record that fails the input schema and an output that
    fails the sink's are dead-lettered naming the JSON path and the rule."""
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    src, out, dlq = (topic_factory(p) for p in ("js-in", "js-out", "js-dlq"))
    orders = [
        {"amount": 5, "currency": "EUR"},  # filtered out
        {"amount": 500, "currency": "EUR"},
        {"amount": 3000, "currency": None},  # fits the input, not the output schema
        {"amount": 1000, "currency": "GBP"},
    ]
    with SchemaRegistryClient({"url": registry_url}) as client:
        ser = JSONSerializer(json.dumps(ORDER_JSON), client)
        values = [ser(o, SerializationContext(src, MessageField.VALUE)) for o in orders]
    sid = values[0][:5]
    values.insert(1, sid + b'{"amount": "lots"}')  # not valid under the input schema
    asyncio.run(produce(kafka_bootstrap, src, [(0, None, v, []) for v in values]))
    doc = pipeline(f"js-{uuid.uuid4().hex[:8]}", src, out, dlq, registry_url, {
        "subject": f"{out}-value", "value_schema": LARGE_JSON,
    })  # fmt: skip
    doc["spec"]["sources"][0]["kafka"]["value_format"] = "json_schema"
    doc["spec"]["sink"]["kafka"]["value_format"] = "json_schema"
    deploy_pipeline(doc)
    records = asyncio.run(read_all(kafka_bootstrap, out, 2, timeout_s=90))
    with SchemaRegistryClient({"url": registry_url}) as client:
        de = JSONDeserializer(None, schema_registry_client=client)
        got = [de(r.value, SerializationContext(out, MessageField.VALUE)) for r in records]
    assert got == [
        {"amount": 500, "currency": "EUR", "amount_cny": 3500},
        {"amount": 1000, "currency": "GBP", "amount_cny": 7000},
    ]
    dead = [decode_record(r) for r in asyncio.run(read_all(kafka_bootstrap, dlq, 2, 60))]
    reasons = sorted(d["eberror"] for d in dead)
    assert "JSON Schema value" in reasons[1] and "at $.amount: 'type' failed" in reasons[1]
    assert f"subject '{out}-value'" in reasons[0] and "at $.currency: 'type' failed" in reasons[0]
