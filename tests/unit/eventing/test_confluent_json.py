"""``value_format: json_schema`` against EventBus's registry app (in memory, over httpx's ASGI
transport): the source's decoder (header, unknown id, documents that do not fit, hostile
documents, a registry that is down, concurrent first fetches) and the sink's encoder."""

from __future__ import annotations

import asyncio
import json
import sys
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from eventbus.errors import EventDecodeError
from eventbus.eventing._confluent_avro import RegistryUnavailableError
from eventbus.eventing._confluent_json import (
    JsonSchemaEncodeError,
    JsonSchemaError,
    JsonSchemaWireDecoder,
    JsonSchemaWireEncoder,
)
from eventbus.eventing._event import CloudEvent
from eventbus.eventing.sinks import KafkaSinkConfig
from eventbus.eventing.sources import KafkaSourceConfig
from eventbus.eventing.sources._kafka_avro import AvroTranscoder
from eventbus.schemas import MemorySchemaLog, SchemaRegistry, build_registry_app

URL = "http://registry.test"
ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}},
                "required": ["sku"],
            },
        },
        "tree": {},
    },
    "required": ["id"],
}


class Counting(httpx.AsyncBaseTransport):
    """The registry app, counting requests; ``down``: every request fails to connect."""

    def __init__(self) -> None:
        self.app = httpx.ASGITransport(app=build_registry_app(SchemaRegistry(MemorySchemaLog())))
        self.calls = 0
        self.down = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        await asyncio.sleep(0)  # let concurrent first fetches overlap
        return await self.app.handle_async_request(request)


async def register(t: Counting, schema: Any, subject: str = "o-value") -> int:
    async with httpx.AsyncClient(transport=t, base_url=URL) as c:
        body = {"schema": json.dumps(schema), "schemaType": "JSON"}
        r = await c.post(f"/subjects/{subject}/versions", json=body)
        assert r.status_code == 200, r.text
        return int(r.json()["id"])


def framed(sid: int, doc: Any) -> bytes:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return b"\x00" + sid.to_bytes(4, "big") + body


async def decoded(values: list[bytes | None]) -> list[Any]:
    t = Counting()
    sid = await register(t, ORDER)
    dec = JsonSchemaWireDecoder(URL, transport=t)
    values = [framed(sid, v) if isinstance(v, (dict, list)) else v for v in values]
    await dec.prepare(values)
    out: list[Any] = []
    for v in values:
        try:
            out.append(json.loads(dec.json_value(v)))
        except EventDecodeError as e:
            out.append(str(e))
    return out


def test_valid_documents_become_data_and_invalid_ones_name_the_path_and_rule() -> None:
    good = {"id": 7, "items": [{"sku": "a"}]}
    got = asyncio.run(
        decoded([
            good,
            {"id": 0},
            {"id": 3, "items": [{"sku": "a"}, {"qty": 1}]},
            b"\x00\x00\x00\x00\x01{not json",
            b"\x01\x00\x00\x00\x01{}",
            b"\x00\x00\x00",
            None,
            b"\x00\x00\x00\x03\xe7{}",
        ])
    )  # fmt: skip
    assert got[0] == good
    assert "at $.id: 'minimum' failed: 0 is less than the minimum of 1" in got[1]
    assert "at $.items[1]: 'required' failed: 'sku' is a required property" in got[2]
    assert "is not JSON" in got[3]
    assert "magic byte 1 is not the Confluent wire format's 0" in got[4]
    assert "shorter than the 5-byte Confluent header" in got[5]
    assert "has no value" in got[6]
    assert "schema id 999 is not in the registry" in got[7] and "40403" in got[7]


def test_hostile_documents_are_named_not_crashes() -> None:
    deep_text = b'{"id": 1, "tree": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    nested_ok = json.loads(b'{"id": 1, "tree": ' + b"[" * 500 + b"]" * 500 + b"}")
    huge = {"id": 1, "items": [{"sku": "x" * 100}] * 50_000}  # ~6 MB
    got = asyncio.run(decoded([framed(1, deep_text), nested_ok, huge]))  # the first id is 1
    assert "is not JSON" in got[0]  # orjson stops at 1024 levels
    assert got[1] == nested_ok
    assert got[2] == huge


def test_a_schema_of_another_type_is_a_dead_letter_reason() -> None:
    async def go() -> str:
        t = Counting()
        async with httpx.AsyncClient(transport=t, base_url=URL) as c:
            r = await c.post("/subjects/a-value/versions", json={"schema": '"string"'})
        dec = JsonSchemaWireDecoder(URL, transport=t)
        value = framed(r.json()["id"], "x")
        await dec.prepare([value])
        with pytest.raises(EventDecodeError) as info:
            dec.json_value(value)
        return str(info.value)

    assert "a AVRO schema, not JSON" in asyncio.run(go())


def test_concurrent_first_fetches_ask_the_registry_once() -> None:
    async def go() -> tuple[int, list[Any]]:
        t = Counting()
        sid = await register(t, ORDER)
        t.calls = 0
        dec = JsonSchemaWireDecoder(URL, transport=t)
        value = framed(sid, {"id": 1})
        await asyncio.gather(*(dec.prepare([value]) for _ in range(20)))
        return t.calls, [json.loads(dec.json_value(value)) for _ in range(3)]

    calls, docs = asyncio.run(go())
    assert calls == 1 and docs == [{"id": 1}] * 3


def test_a_registry_that_is_down_is_retried_not_dead_lettered() -> None:
    """The transcoder waits for the registry (backoff) and decodes once it answers."""

    async def go() -> tuple[Any, int, Any]:
        t = Counting()
        sid = await register(t, ORDER)
        t.down = True
        dec = JsonSchemaWireDecoder(URL, transport=t)
        with pytest.raises(RegistryUnavailableError, match="did not answer"):
            await dec.prepare([framed(sid, {"id": 1})])
        tr = AvroTranscoder(URL, "p", lambda: False, dec)
        record = SimpleNamespace(value=framed(sid, {"id": 2}), topic="t", partition=0, offset=5)
        task = asyncio.create_task(tr.transcode({"tp": [record]}))
        while tr.registry_waits < 2:  # it waits, it does not give up
            await asyncio.sleep(0.01)
        t.down = False
        failed = await task
        return failed, tr.registry_waits, record.value

    failed, waits, value = asyncio.run(go())
    assert failed == {} and waits >= 2 and json.loads(value) == {"id": 2}


def test_the_transcoder_is_chosen_by_value_format() -> None:
    cfg = KafkaSourceConfig(topic="t", value_format="json_schema", schema_registry_url=URL)
    tr = AvroTranscoder.of(cfg, "p", lambda: False)
    assert tr is not None and isinstance(tr.decoder, JsonSchemaWireDecoder)
    with pytest.raises(
        ValidationError, match="value_format is 'json_schema' but schema_registry_url"
    ):
        KafkaSourceConfig(topic="t", value_format="json_schema")


def encoder(t: Counting, **kw: Any) -> JsonSchemaWireEncoder:
    enc = JsonSchemaWireEncoder(URL, "out-value", transport=t, **kw)
    asyncio.run(enc.resolve())
    return enc


def test_the_encoder_registers_validates_and_frames() -> None:
    t = Counting()
    enc = encoder(t, schema=ORDER)
    value = enc.encode_datum({"id": 5})
    assert value[:5] == b"\x00" + (enc.schema_id or 0).to_bytes(4, "big")
    assert json.loads(value[5:]) == {"id": 5}
    with pytest.raises(
        JsonSchemaEncodeError, match=r"at \$: 'required' failed: 'id' is a required"
    ):
        enc.encode_datum({"items": []})
    with pytest.raises(JsonSchemaEncodeError, match="subject 'out-value'") as info:
        enc.encode_datum({"id": 1, "items": [{"sku": "s" * 5_000_000}, {}]})
    assert len(str(info.value)) <= 1000  # a huge value is cut in the reason
    headers, body = enc.encode_event(CloudEvent.create(type="t", source="s", data={"id": 9}))
    assert ("content-type", b"application/json") in headers and body == value[:5] + b'{"id":9}'
    pinned = encoder(t, version=1)
    assert pinned.schema_id == enc.schema_id


def test_the_encoder_refuses_a_pinned_version_of_another_type_or_missing() -> None:
    t = Counting()

    async def avro() -> None:
        async with httpx.AsyncClient(transport=t, base_url=URL) as c:
            await c.post("/subjects/out-value/versions", json={"schema": '"string"'})

    asyncio.run(avro())
    with pytest.raises(JsonSchemaError, match="is a AVRO schema, not JSON"):
        encoder(t, version=1)
    with pytest.raises(JsonSchemaError, match="version 4 is not in"):
        encoder(t, version=4)


@pytest.mark.parametrize(
    ("fields", "expect"),
    [
        ({"value_schema": {"type": 5}}, "not a valid JSON Schema"),
        ({"value_schema": "{"}, "not JSON"),
        ({}, "needs value_schema"),
        ({"value_schema": ORDER, "mode": "structured"}, "remove 'mode: structured'"),
    ],
)
def test_sink_config_is_checked(fields: dict[str, Any], expect: str) -> None:
    base = {
        "topic": "o",
        "value_format": "json_schema",
        "schema_registry_url": URL,
        "subject": "o-value",
    }
    with pytest.raises(ValidationError, match=expect):
        KafkaSinkConfig(**{**base, **fields})
    assert KafkaSinkConfig(**{**base, "value_schema": ORDER}).value_format == "json_schema"


def test_a_document_too_deep_for_a_recursive_schema_is_named() -> None:
    import orjson

    from eventbus.eventing._confluent_json import json_schema_validator, why_invalid

    nested = {
        "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
        "$ref": "#/$defs/n",
    }
    v = json_schema_validator(nested)
    deep = orjson.loads("[" * 1000 + "]" * 1000)  # JSON the source accepts (orjson: 1024 levels)
    bad_leaf = orjson.loads("[" * 1000 + '"x"' + "]" * 1000)
    # the same answers whatever the recursion limit was before (the JSONata engine raises it
    # when it first runs; CI runs the JSONata tests before this one, a single module does not)
    limit = sys.getrecursionlimit()
    for before in (1000, limit):
        sys.setrecursionlimit(before)
        try:
            assert why_invalid(v, deep) is None
            why = why_invalid(v, bad_leaf)
        finally:
            sys.setrecursionlimit(max(limit, sys.getrecursionlimit()))
        assert why is not None and why.startswith("at $[0][0]") and "(1000 levels)" in why, why
        assert why.endswith("'type' failed: 'x' is not of type 'array'") and len(why) < 300, why
    shallow = json.loads("[" * 10 + "1" + "]" * 10)
    assert why_invalid(v, shallow) == f"at ${'[0]' * 10}: 'type' failed: 1 is not of type 'array'"


def test_a_cancelled_first_fetch_does_not_fail_the_batches_sharing_it() -> None:
    async def go() -> tuple[list[Any], bytes]:
        t = Counting()
        sid = await register(t, ORDER)
        dec = JsonSchemaWireDecoder(URL, transport=t)
        value = framed(sid, {"id": 1})
        first, second = (asyncio.create_task(dec.prepare([value])) for _ in range(2))
        await asyncio.sleep(0)  # both started: the first fetches, the second shares it
        first.cancel()
        done = await asyncio.gather(first, second, return_exceptions=True)
        return [type(d).__name__ for d in done], dec.json_value(value)

    kinds, value = asyncio.run(go())
    assert kinds == ["CancelledError", "NoneType"] and json.loads(value) == {"id": 1}


def test_deploy_checks_a_json_schema_sink_against_its_subject() -> None:
    """The deploy-time check sends schemaType JSON: an incompatible change is refused with
    the registry's reason, nothing registered; a compatible one is registered."""
    from tests.integration.registry_helpers import Served

    from eventbus.pipelines import validate_pipeline_text
    from eventbus.serving._schema_checks import sink_schema_problems

    served = Served(build_registry_app(SchemaRegistry(MemorySchemaLog())), lifespan="off")
    try:

        def problems(schema: Any) -> list[str]:
            sink = {
                "topic": "out",
                "value_format": "json_schema",
                "schema_registry_url": served.url,
                "subject": "out-value",
                "value_schema": schema,
            }
            doc = {
                "apiVersion": "eventbus/v1",
                "kind": "Pipeline",
                "metadata": {"name": "p"},
                "spec": {"sources": [{"kafka": {"topic": "in"}}], "sink": {"kafka": sink}},
            }
            config, bad = validate_pipeline_text(json.dumps(doc), "p.yaml")
            assert config is not None, bad
            return sink_schema_problems(config)

        assert problems(ORDER) == []  # a new subject: registered
        opened = {**ORDER, "properties": {**ORDER["properties"], "note": {"type": "string"}}}
        (refused,) = problems(opened)
        assert "spec.sink.kafka.value_schema: incompatible with subject 'out-value'" in refused
        assert "#/properties/note: property added to an open content model" in refused
        versions = httpx.get(f"{served.url}/subjects/out-value/versions").json()
        assert versions == [1]
    finally:
        served.stop()
