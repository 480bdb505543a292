"""The Kafka sink's Avro encoder against EventBus's registry app (in memory, over httpx's ASGI
transport): the wire format, data that does not fit (named, never a crash), hostile inputs,
concurrent first registrations, and the sink's config checks."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import Any

import fastavro
import httpx
import pytest
from pydantic import ValidationError

from eventbus.eventing._avro_encode import AvroEncodeError, AvroSchemaError, AvroWireEncoder
from eventbus.eventing._confluent_avro import RegistryUnavailableError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing.sinks import KafkaSinkConfig
from eventbus.eventing.sources._kafka_errors import is_infrastructure
from eventbus.pipelines import validate_pipeline_text
from eventbus.schemas import MemorySchemaLog, SchemaRegistry, build_registry_app

URL = "http://registry.test"
PAYMENT = {
    "type": "record",
    "name": "Payment",
    "fields": [
        {"name": "amount", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "raw", "type": ["null", "bytes"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    ],
}
LINKED = {
    "type": "record",
    "name": "Node",
    "fields": [{"name": "next", "type": ["null", "Node"], "default": None}],
}


def registry() -> tuple[SchemaRegistry, httpx.ASGITransport]:
    reg = SchemaRegistry(MemorySchemaLog())
    return reg, httpx.ASGITransport(app=build_registry_app(reg))


def encoder(schema: Any = PAYMENT, **kw: Any) -> AvroWireEncoder:
    _, transport = kw.pop("registry", None) or registry()
    enc = AvroWireEncoder(URL, "pay-value", schema=schema, transport=transport, **kw)
    asyncio.run(enc.resolve())
    return enc


def read(enc: AvroWireEncoder, value: bytes) -> Any:
    assert value[0] == 0 and int.from_bytes(value[1:5], "big") == enc.schema_id
    body = io.BytesIO(value[5:])
    datum = fastavro.schemaless_reader(body, fastavro.parse_schema(enc_schema(enc)), None)
    assert body.tell() == len(value) - 5
    return datum


def enc_schema(enc: AvroWireEncoder) -> Any:
    assert enc.schema_text is not None
    return json.loads(enc.schema_text)


def test_the_wire_format_round_trips_with_json_forms() -> None:
    enc = encoder()
    assert enc.schema_id == 1
    raw = base64.b64encode(b"\x00\xff").decode()  # bytes as the Avro source writes them
    value = enc.encode_datum({"amount": 2**40, "note": "x", "raw": raw, "tags": ["a"]})
    assert read(enc, value) == {"amount": 2**40, "note": "x", "raw": b"\x00\xff", "tags": ["a"]}
    # nulls, defaults left out, the other union branch
    assert read(enc, enc.encode_datum({"amount": 1}))["note"] is None


@pytest.mark.parametrize(
    ("data", "expect"),
    [
        ({"amount": "abc"}, "Payment.amount is <abc> of type <class 'str'> expected long"),
        ({"amount": 2**63}, "expected long"),  # out of range
        ({"amount": 1.5}, "of type <class 'float'> expected long"),
        (
            {"amount": None},
            "Field(Payment.amount) is None expected long",
        ),  # null where none is allowed
        ({"note": "n"}, "Field(Payment.amount) is None expected long"),  # a required field missing
        ({"amount": 1, "note": 5}, "Payment.note is <5>"),  # no union branch fits
        ({"amount": 1, "tags": ["a", 2]}, "Payment.tags is <2> of type <class 'int'> expected"),
        ({"amount": 1, "raw": "not base64!"}, "Payment.raw is <not base64!>"),
        ([1, 2], "the data is a list; record Payment needs an object"),
        ("text", "the data is a str; record Payment needs an object"),
        (None, "the data is a NoneType; record Payment needs an object"),
    ],
)
def test_data_that_does_not_fit_is_named(data: Any, expect: str) -> None:
    enc = encoder()
    with pytest.raises(AvroEncodeError, match=r"subject 'pay-value' \(id 1\)") as info:
        enc.encode_datum(data)
    assert expect in str(info.value)


def test_a_huge_wrong_value_gives_a_short_reason() -> None:
    enc = encoder()
    with pytest.raises(AvroEncodeError) as info:
        enc.encode_datum({"amount": "x" * 10_000_000})
    assert len(str(info.value)) <= 1000 and "(cut)" in str(info.value)
    # a large value that fits is written whole
    big = enc.encode_datum({"amount": 1, "note": "y" * 5_000_000})
    assert read(enc, big)["note"] == "y" * 5_000_000


def test_deep_records_are_written_or_refused_by_name() -> None:
    enc = encoder(LINKED)
    node: dict[str, Any] = {"next": None}
    for _ in range(50):
        node = {"next": node}
    assert read(enc, enc.encode_datum(node)) == node
    for _ in range(100_000):  # deeper than Python's recursion limit
        node = {"next": node}
    with pytest.raises(AvroEncodeError, match="nests deeper|Node.next|RecursionError"):
        enc.encode_datum(node)


def test_encode_event_frames_the_data_and_keeps_attributes_as_headers() -> None:
    enc = encoder()
    event = CloudEvent.create(type="payment", source="/t", data={"amount": 3})
    headers, value = enc.encode_event(event)
    assert read(enc, value or b"")["amount"] == 3
    names = dict(headers)
    assert names["content-type"] == b"application/avro" and names["ce_type"] == b"payment"


def test_concurrent_first_registrations_get_one_id() -> None:
    reg, transport = registry()

    async def main() -> set[int | None]:
        encs = [
            AvroWireEncoder(URL, "pay-value", schema=PAYMENT, transport=transport)
            for _ in range(20)
        ]
        await asyncio.gather(*(e.resolve() for e in encs))
        return {e.schema_id for e in encs}

    assert asyncio.run(main()) == {1}
    assert [e.version for e in reg.state.live("pay-value")] == [1]


def test_a_pinned_version_and_its_refusals() -> None:
    reg, transport = registry()
    first = encoder(registry=(reg, transport))
    pinned = AvroWireEncoder(URL, "pay-value", version=1, transport=transport)
    asyncio.run(pinned.resolve())
    assert pinned.schema_id == first.schema_id
    latest = AvroWireEncoder(URL, "pay-value", version="latest", transport=transport)
    asyncio.run(latest.resolve())
    assert latest.schema_id == first.schema_id
    for subject, version in (("pay-value", 7), ("no-such-value", 1)):
        missing = AvroWireEncoder(URL, subject, version=version, transport=transport)
        with pytest.raises(AvroSchemaError, match=f"subject '{subject}' version {version}"):
            asyncio.run(missing.resolve())
    # an incompatible schema for the subject (BACKWARD: a new field without a default)
    changed = dict(PAYMENT, fields=[*PAYMENT["fields"], {"name": "x", "type": "int"}])
    bad = AvroWireEncoder(URL, "pay-value", schema=changed, transport=transport)
    with pytest.raises(AvroSchemaError, match="409 409.*make the change compatible"):
        asyncio.run(bad.resolve())


@pytest.mark.parametrize("sid", [2**31, -1, "7", True, None])
def test_a_schema_id_the_wire_format_cannot_hold_is_refused(sid: Any) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": sid, "schema": json.dumps(PAYMENT)})

    enc = AvroWireEncoder(URL, "s", version=1, transport=httpx.MockTransport(answer))
    with pytest.raises(AvroSchemaError, match="the wire format holds ids 0..2147483647"):
        asyncio.run(enc.resolve())
    assert not enc.ready


def test_a_registry_that_is_down_is_an_infrastructure_error() -> None:
    enc = AvroWireEncoder("http://127.0.0.1:1", "s", schema=PAYMENT)
    with pytest.raises(RegistryUnavailableError, match="did not answer") as info:
        enc.resolve_sync()
    assert is_infrastructure(info.value)
    # raised out of a replica's process_records, it reaches the source inside Ray's error:
    # still an outage (the batch waits), not a poison batch to dead-letter
    from ray.exceptions import RayTaskError

    assert is_infrastructure(RayTaskError("f", "tb", info.value).as_instanceof_cause())

    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="overloaded")

    enc = AvroWireEncoder(URL, "s", schema=PAYMENT, transport=httpx.MockTransport(busy))
    with pytest.raises(RegistryUnavailableError, match="answered 503"):
        asyncio.run(enc.resolve())


def test_encoding_before_resolving_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="resolve"):
        AvroWireEncoder(URL, "s", schema=PAYMENT).encode_datum({"amount": 1})


AVRO = {"topic": "out", "value_format": "avro", "schema_registry_url": URL, "subject": "s"}


@pytest.mark.parametrize(
    ("changes", "expect"),
    [
        ({"schema_registry_url": None, "version": 1}, "schema_registry_url is not set"),
        ({"subject": None, "version": 1}, "subject is not set"),
        ({}, "give exactly one"),
        ({"version": 1, "value_schema": PAYMENT}, "give exactly one"),
        ({"value_schema": {"type": "record"}}, "value_schema: not an Avro schema"),
        ({"value_schema": "{not json"}, "value_schema: the Avro schema is not JSON"),
        ({"value_schema": {"type": "nope"}}, "value_schema: not an Avro schema"),
        ({"version": 1, "mode": "structured"}, "remove 'mode: structured'"),
        ({"version": 0}, "greater than 0"),
        ({"value_format": "json", "version": 1}, "only apply to value_format 'avro'"),
        ({"value_schema_file": "/no/such.avsc"}, "value_schema_file '/no/such.avsc' cannot"),
    ],
)
def test_sink_config_errors_name_the_fix(changes: dict[str, Any], expect: str) -> None:
    raw = {k: v for k, v in {**AVRO, **changes}.items() if v is not None}
    with pytest.raises(ValidationError, match=expect):
        KafkaSinkConfig.model_validate(raw)


def test_a_schema_file_is_read_and_carried_inline(tmp_path: Any) -> None:
    f = tmp_path / "payment.avsc"
    f.write_text(json.dumps(PAYMENT))
    config = KafkaSinkConfig.model_validate({**AVRO, "value_schema_file": str(f)})
    assert json.loads(str(config.value_schema)) == PAYMENT
    assert config.value_schema_file is None
    again = KafkaSinkConfig.model_validate(config.model_dump(exclude_none=True))
    assert again == config  # a replica validating the document needs no file


def test_a_relative_schema_file_is_read_from_the_pipeline_files_directory(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "p.avsc").write_text(json.dumps(PAYMENT))
    sink = "{topic: out, value_format: avro, schema_registry_url: http://r, subject: s, "
    text = f"""\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: p}}
spec:
  sources: [{{kafka: {{topic: in}}}}]
  sink: {{kafka: {sink}value_schema_file: schemas/p.avsc}}}}
"""
    monkeypatch.chdir("/")  # not where the pipeline is
    config, problems = validate_pipeline_text(text, str(tmp_path / "p.yaml"))
    assert problems == []
    assert config is not None and config.spec.sink is not None
    assert json.loads(str(config.spec.sink.kafka.value_schema)) == PAYMENT  # type: ignore[union-attr]
    # the controller gets the YAML text and the pipeline's directory
    config, _ = validate_pipeline_text(text, "p.yaml", base_dir=str(tmp_path))
    assert config is not None
    _, problems = validate_pipeline_text(text, "p.yaml")
    assert "value_schema_file 'schemas/p.avsc' cannot be read" in str(problems[0])
    assert "from the pipeline file's directory ('/')" in str(problems[0])


def test_a_pipeline_error_names_the_yaml_path() -> None:
    text = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: p}
spec:
  sources: [{kafka: {topic: in}}]
  sink:
    kafka: {topic: out, value_format: avro, subject: out-value, version: 1}
"""
    _, problems = validate_pipeline_text(text, "p.yaml")
    assert len(problems) == 1
    line = str(problems[0])
    assert line.startswith("p.yaml:7:") and "spec.sink.kafka" in line
    assert "schema_registry_url is not set" in line


def test_bytes_fixed_and_decimals_deep_in_arrays_maps_and_named_types() -> None:
    item = {
        "type": "record",
        "name": "Item",
        "fields": [
            {"name": "sku", "type": "string"},
            {"name": "blob", "type": {"type": "fixed", "name": "Two", "size": 2}},
            {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}},
        ],
    }  # fmt: skip
    order = {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "items", "type": {"type": "array", "items": item}},
            {"name": "extra", "type": {"type": "map", "values": "Item"}},
        ],
    }
    enc = encoder(order)
    one = {"sku": "a", "blob": base64.b64encode(b"\x01\x02").decode(), "price": "12.50"}
    got = read(enc, enc.encode_datum({"items": [one], "extra": {"k": one}}))
    assert got["items"][0]["blob"] == b"\x01\x02" and str(got["extra"]["k"]["price"]) == "12.50"
    with pytest.raises(AvroEncodeError, match="Item.blob"):
        enc.encode_datum(
            {"items": [{**one, "blob": base64.b64encode(b"abc").decode()}], "extra": {}}
        )
