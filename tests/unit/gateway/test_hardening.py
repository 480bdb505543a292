"""Hostile requests get a clear 4xx (gRPC: INVALID_ARGUMENT...), fast: deep JSON, attributes of
the wrong JSON type, out-of-range timestamps, oversized headers and attributes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import orjson
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from eventbus.eventing._codecs import MAX_JSON_DEPTH
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.eventing._proto import cloudevents_pb2 as pb
from eventbus.eventing._proto import eventbus_pb2_grpc
from eventbus.eventing._protobuf import event_to_proto, events_to_proto_batch
from eventbus.gateway._backend import _to_record
from eventbus.gateway._grpc import MAX_METADATA_BYTES, build_grpc_server
from eventbus.gateway._http import MAX_HEADER_BYTES, build_http_app
from eventbus.gateway._ingress import MAX_ATTRIBUTE_CHARS, MAX_BATCH_EVENTS, Ingress
from eventbus.gateway._routes import RouteTable
from eventbus.observability import configure_tracing, shutdown_tracing
from tests.unit.gateway.conftest import STEPS, MemoryBackend, pipeline_doc

CE = {
    "ce-specversion": "1.0",
    "ce-id": "e1",
    "ce-source": "/shop",
    "ce-type": "payment.created",
    "content-type": "application/json",
}
STRUCTURED = {"content-type": "application/cloudevents+json"}
BATCH = {"content-type": "application/cloudevents-batch+json"}
ASYNC = "/v1/pipelines/open/events"
SYNC = "/v1/pipelines/answers/events"
#: a hostile request must be answered within this: milliseconds when right, the 10-30 s
#: timeouts or never when wrong, so a generous bound a loaded 2-core machine cannot trip
FAST_S = 5.0
#: a bound a loaded machine cannot trip for what takes milliseconds when right and a minute
#: or more when wrong (a backtracking regex on EVIL_TEXT, a body timeout not applied)
SLOW_S = 10.0


class EncodingBackend(MemoryBackend):
    """Publishes as the real backend does up to the broker: each event encoded as a record."""

    async def publish(self, pipeline: str, events: list[CloudEvent]) -> None:
        records = [_to_record(e) for e in events]
        await super().publish(pipeline, events)
        self.records = records

    async def invoke(self, pipeline: str, events: list[CloudEvent]) -> list[Outcome]:
        return await super().invoke(pipeline, events)


def docs() -> list[dict[str, Any]]:
    return [
        pipeline_doc("open", [{"http": {"path": "/hooks/open"}}, {"grpc": {}}], STEPS),
        pipeline_doc("answers", [{"http": {"mode": "sync"}}, {"grpc": {"mode": "sync"}}], []),
    ]


@pytest.fixture
def ingress() -> Ingress:
    d = docs()
    return Ingress(EncodingBackend(d), RouteTable.from_documents(d, {}))


@pytest.fixture
def client(ingress: Ingress) -> httpx.AsyncClient:
    app = build_http_app(ingress)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


@pytest.fixture
async def stub(ingress: Ingress):
    server, port = build_grpc_server(ingress, "127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield eventbus_pb2_grpc.EventBusStub(channel)
    await channel.close()
    await server.stop(0)


@pytest.fixture
def tracing() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    configure_tracing(exporter=exp)
    yield exp
    shutdown_tracing()


async def post(client: httpx.AsyncClient, path: str, headers: dict[str, str], body: bytes):
    started = time.perf_counter()
    r = await client.post(path, headers=headers, content=body)
    elapsed = time.perf_counter() - started
    assert elapsed < FAST_S, f"{path} took {elapsed:.2f} s"
    return r


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def nested_json(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


def event(**attrs: Any) -> dict[str, Any]:
    return {"specversion": "1.0", "id": "s1", "source": "/s", "type": "t", **attrs}


# -- 1. deep JSON --------------------------------------------------------------------------
DEPTH_ERROR = f"more than {MAX_JSON_DEPTH} levels deep"


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 300, 1000, 1100])
@pytest.mark.parametrize("path", [ASYNC, SYNC])
async def test_deep_json_is_400_naming_the_limit_in_every_mode(
    client: httpx.AsyncClient, depth: int, path: str
) -> None:
    data = nested_json(depth)
    requests = [
        (CE, data),  # binary
        ({"content-type": "application/json"}, data),  # plain
        (
            STRUCTURED,
            b'{"specversion":"1.0","id":"s","source":"/s","type":"t","data":' + data + b"}",
        ),
        (BATCH, b'[{"specversion":"1.0","id":"s","source":"/s","type":"t","data":' + data + b"}]"),
    ]
    for headers, body in requests:
        r = await post(client, path, headers, body)
        assert r.status_code == 400, (headers, r.text)
        error = r.json()["error"]
        assert DEPTH_ERROR in error or "depth limit exceeded" in error, error


@pytest.mark.parametrize("path", [ASYNC, SYNC])
async def test_json_at_the_depth_limit_goes_through(client: httpx.AsyncClient, path: str) -> None:
    data = nested(MAX_JSON_DEPTH)
    r = await post(client, path, CE, orjson.dumps(data))
    assert r.status_code in (200, 202), r.text
    # the batch and structured envelopes count: the body may nest MAX_JSON_DEPTH in all
    batch = [event(data=nested(MAX_JSON_DEPTH - 2))]
    r = await post(client, path, BATCH, orjson.dumps(batch))
    assert r.status_code in (200, 202), r.text
    if path == SYNC:
        assert r.json()[0]["data"] == nested(MAX_JSON_DEPTH - 2)


def test_a_recursive_data_schema_validates_data_at_the_depth_limit() -> None:
    schema = {
        "$defs": {"node": {"type": ["array", "integer"], "items": {"$ref": "#/$defs/node"}}},
        "$ref": "#/$defs/node",
    }
    d = [pipeline_doc("deep", [{"http": {"data_schema": schema}}])]
    ingress = Ingress(MemoryBackend(d), RouteTable.from_documents(d, {}))
    route = ingress.routes.http_route("deep")
    ingress.validate(route, [CloudEvent.create(type="t", source="/s", data=nested(MAX_JSON_DEPTH))])


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 600])
@pytest.mark.parametrize("method", ["Publish", "Invoke"])
async def test_deep_json_over_grpc_is_invalid_argument(stub, depth: int, method: str) -> None:
    msg = event_to_proto(CloudEvent.create(type="t", source="/s", id="g1", data={"a": 1}))
    msg.text_data = nested_json(depth).decode()
    pipeline = "open" if method == "Publish" else "answers"
    call = (
        stub.Publish(pb.CloudEventBatch(events=[msg]), metadata=[("x-eventbus-pipeline", pipeline)])
        if method == "Publish"
        else stub.Invoke(msg, metadata=[("x-eventbus-pipeline", pipeline)])
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert DEPTH_ERROR in err.value.details()


# -- 2. attributes of the wrong JSON type ---------------------------------------------------
WRONG_TYPES = [
    ({"traceparent": 5}, "attribute 'traceparent' is 5 (int); traceparent must be a string"),
    ({"traceparent": {"a": 1}}, "attribute 'traceparent' is {'a': 1} (dict)"),
    ({"tracestate": True}, "attribute 'tracestate' is True (bool); tracestate must be a string"),
    ({"partitionkey": 7}, "attribute 'partitionkey' is 7 (int); partitionkey must be a string"),
    ({"id": 5}, "attribute 'id' is 5 (int); id must be a string"),
    ({"specversion": ["1.0"]}, "attribute 'specversion' is ['1.0']"),
    ({"source": None, "type": "t"}, "attribute 'source' is missing"),
    ({"ext": {"a": 1}}, "attribute 'ext' is {'a': 1} (dict); extension attribute values"),
    ({"ext": 1.5}, "attribute 'ext' is 1.5 (float)"),
    ({"time": "yesterday"}, "attribute 'time' is 'yesterday'; time must be RFC 3339"),
    ({"time": 1714564800}, "attribute 'time' is 1714564800 (int)"),
    ({"subject": ["a"]}, "attribute 'subject' is ['a'] (list); subject must be a string"),
    ({"datacontenttype": 3}, "attribute 'datacontenttype' is 3 (int)"),
    ({"data_base64": 3}, '"data_base64" is 3 (int)'),
    ({"data_base64": "%%%"}, '"data_base64" is not valid base64'),
    ({"Bad-Name": "x"}, "names attribute 'Bad-Name'"),
    ({"x" * 10_000: "x"}, "names attribute 'xxxxxxxx"),
]


@pytest.mark.parametrize(("attrs", "expect"), WRONG_TYPES)
async def test_attributes_of_the_wrong_json_type_are_400_with_tracing_on(
    client: httpx.AsyncClient, tracing: InMemorySpanExporter, attrs: dict[str, Any], expect: str
) -> None:
    one = event(**attrs)
    for path in (ASYNC, SYNC):
        r = await post(client, path, STRUCTURED, orjson.dumps(one))
        assert r.status_code == 400, r.text
        assert expect in r.json()["error"]
        assert len(r.json()["error"]) < 600  # the value is shown cut short
        r = await post(client, path, BATCH, orjson.dumps([event(id="ok"), one]))
        assert r.status_code == 400, r.text
        assert r.json()["error"].startswith("batch[1]: ") and expect in r.json()["error"]


async def test_a_string_traceparent_is_still_traced(
    client: httpx.AsyncClient, tracing: InMemorySpanExporter
) -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    r = await post(client, ASYNC, STRUCTURED, orjson.dumps(event(traceparent=tp)))
    assert r.status_code == 202
    (span,) = tracing.get_finished_spans()
    assert f"{span.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"


# -- 3. out-of-range gRPC timestamps --------------------------------------------------------
@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [(2**62, 0), (-(2**62), 0), (253_402_300_800, 0), (0, -1), (0, 1_000_000_000)],
)
async def test_out_of_range_ce_timestamp_is_invalid_argument_naming_it(
    stub, seconds: int, nanos: int
) -> None:
    msg = event_to_proto(CloudEvent.create(type="t", source="/s", id="g1", data={"a": 1}))
    msg.attributes["time"].ce_timestamp.seconds = seconds
    msg.attributes["time"].ce_timestamp.nanos = nanos
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Publish(
            pb.CloudEventBatch(events=[msg]), metadata=[("x-eventbus-pipeline", "open")]
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"attribute 'time' is a ce_timestamp of seconds={seconds}, nanos={nanos}" in (
        err.value.details()
    )


async def test_ce_timestamp_at_the_edges_and_exact(stub) -> None:
    for seconds, nanos, text in [
        (-62_135_596_800, 0, "0001-01-01T00:00:00Z"),
        (253_402_300_799, 999_999_999, "9999-12-31T23:59:59.999999Z"),
        (1_714_564_800, 123_456_000, "2024-05-01T12:00:00.123456Z"),
    ]:
        msg = event_to_proto(CloudEvent.create(type="t", source="/s", id=text, data={"a": 1}))
        msg.attributes["time"].ce_timestamp.seconds = seconds
        msg.attributes["time"].ce_timestamp.nanos = nanos
        reply = await stub.Publish(
            pb.CloudEventBatch(events=[msg]), metadata=[("x-eventbus-pipeline", "open")]
        )
        assert reply.accepted == 1


# -- 4. header and attribute sizes ----------------------------------------------------------
async def test_a_70kb_ce_id_is_400_and_never_echoed(client: httpx.AsyncClient) -> None:
    for path in (ASYNC, SYNC):
        r = await post(client, path, {**CE, "ce-id": "x" * 70_000}, b'{"amount": 500}')
        assert r.status_code == 431, r.text
        assert f"at most {MAX_HEADER_BYTES}" in r.json()["error"]
        assert "x" * 100 not in r.text and not any("x" * 100 in v for v in r.headers.values())


@pytest.mark.parametrize("name", ["ce-id", "ce-source", "ce-type", "ce-subject", "ce-ext"])
async def test_an_attribute_over_the_cap_is_400_naming_it(
    client: httpx.AsyncClient, name: str
) -> None:
    long = "a" * (MAX_ATTRIBUTE_CHARS + 1)
    r = await post(client, SYNC, {**CE, name: long}, b'{"amount": 500}')
    assert r.status_code == 400, r.text
    expect = f"header {name} is {MAX_ATTRIBUTE_CHARS + 1} characters long; the gateway takes at most {MAX_ATTRIBUTE_CHARS}"
    assert expect in r.json()["error"]
    attr = name[3:]
    for headers, body in [
        (STRUCTURED, orjson.dumps(event(**{attr: long}))),
        (BATCH, orjson.dumps([event(**{attr: long})])),
    ]:
        r = await post(client, ASYNC, headers, body)
        assert r.status_code == 400, r.text
        assert (
            f"attribute '{attr}' is {MAX_ATTRIBUTE_CHARS + 1} characters long" in r.json()["error"]
        )
    ok = "a" * MAX_ATTRIBUTE_CHARS
    r = await post(client, SYNC, {**CE, name: ok}, b'{"amount": 500}')
    assert r.status_code == 200 and r.headers[name] == ok


async def test_too_many_headers_in_all_are_431(client: httpx.AsyncClient) -> None:
    many = {f"x-h{i}": "v" * 100 for i in range(200)}
    r = await post(client, ASYNC, {**CE, **many}, b"{}")
    assert r.status_code == 431
    assert "request headers are" in r.json()["error"]
    # other routes too
    r = await client.get("/healthz", headers=many)
    assert r.status_code == 431


async def test_a_content_type_that_is_not_ascii_is_400(client: httpx.AsyncClient) -> None:
    r = await post(
        client,
        SYNC,
        STRUCTURED,
        orjson.dumps(event(datacontenttype="application/json; x=\u2713", data={"amount": 1})),
    )
    assert r.status_code == 400
    assert "a content type is printable ASCII" in r.json()["error"]


async def test_grpc_attribute_and_metadata_caps(stub) -> None:
    msg = event_to_proto(
        CloudEvent.create(type="t", source="/s", id="i" * (MAX_ATTRIBUTE_CHARS + 1), data={"a": 1})
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Publish(
            pb.CloudEventBatch(events=[msg]), metadata=[("x-eventbus-pipeline", "open")]
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"attribute 'id' is {MAX_ATTRIBUTE_CHARS + 1} characters long" in err.value.details()
    ok = event_to_proto(CloudEvent.create(type="t", source="/s", id="g", data={"a": 1}))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Publish(
            pb.CloudEventBatch(events=[ok]),
            metadata=[("x-eventbus-pipeline", "open"), ("x-big", "m" * (MAX_METADATA_BYTES + 1))],
        )
    assert err.value.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL)
    reply = await stub.Publish(
        pb.CloudEventBatch(events=[ok]), metadata=[("x-eventbus-pipeline", "open")]
    )
    assert reply.accepted == 1


async def test_grpc_batch_over_the_event_cap_is_invalid_argument(stub) -> None:
    one = CloudEvent.create(type="t", source="/s", id="g", data=None)
    batch = events_to_proto_batch([one] * (MAX_BATCH_EVENTS + 1))
    started = time.perf_counter()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Publish(batch, metadata=[("x-eventbus-pipeline", "open")])
    assert time.perf_counter() - started < FAST_S
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {MAX_BATCH_EVENTS} are taken per call" in err.value.details()


# -- 5. record size, checked before producing; one oversize record fails alone --------------
class BrokerSink:
    """A sink that refuses a whole produce, as a broker does, when one record is too large."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sends: list[list[Any]] = []
        self.acked: list[Any] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, items: list[tuple[Any, bytes | None]]) -> None:
        from aiokafka.errors import MessageSizeTooLargeError

        records = [r for r, _ in items]
        self.sends.append(records)
        await asyncio.sleep(0)  # a round trip: let other requests gather meanwhile
        for r in records:
            size = len(r.value or b"") + sum(len(k) + len(v) for k, v in r.headers)
            if size > self.limit:
                raise MessageSizeTooLargeError(f"a record of {size} bytes")
        self.acked.extend(records)


def backend_app(limit: int) -> tuple[httpx.AsyncClient, list[BrokerSink]]:
    from eventbus.gateway._backend import GatewayBackend

    sinks: list[BrokerSink] = []

    def make_sink(topic: str, lane: tuple[int, int]) -> BrokerSink:
        sinks.append(BrokerSink(limit))
        return sinks[-1]

    d = [pipeline_doc("big", [{"http": {"max_body_bytes": 4 * 1024 * 1024}}])]
    backend = GatewayBackend("unused:9092", producers=1, make_sink=make_sink)
    app = build_http_app(Ingress(backend, RouteTable.from_documents(d, {})))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    return client, sinks


def binary(i: int, data: bytes, **extra: str) -> tuple[dict[str, str], bytes]:
    headers = {**CE, "ce-id": f"e{i}", "content-type": "application/octet-stream", **extra}
    return headers, data


async def test_an_oversize_record_is_413_before_producing_and_fails_alone() -> None:
    from eventbus.gateway._backend import MAX_RECORD_BYTES

    client, sinks = backend_app(limit=1024 * 1024)  # the producer's max_request_size
    # Under the limit by its data alone, over the producer's with its attributes (structured
    # mode has no header limit): this record used to join a produce and fail it whole (503
    # for every request batched with it).
    wide = event(id="e3", data="x" * (MAX_RECORD_BYTES - 10_000))
    wide.update({f"x{j}": "v" * 1000 for j in range(40)})
    requests = [binary(i, b"small") for i in range(20)]
    requests[3] = (STRUCTURED, orjson.dumps(wide))
    requests[11] = binary(11, b"x" * (MAX_RECORD_BYTES + 1))
    replies = await asyncio.gather(
        *(client.post("/v1/pipelines/big/events", headers=h, content=b) for h, b in requests)
    )
    assert [r.status_code for r in replies] == [413 if i in (3, 11) else 202 for i in range(20)]
    error = replies[3].json()["error"]
    data_size = MAX_RECORD_BYTES - 10_000 + 2  # a JSON string: quoted
    assert f"bytes as a Kafka record (data {data_size}, attributes and key" in error
    assert f"a record may have at most {MAX_RECORD_BYTES}" in error
    assert f"(data {MAX_RECORD_BYTES + 1}, attributes and key" in replies[11].json()["error"]
    acked = {dict(r.headers)["ce_id"] for r in sinks[0].acked}
    assert acked == {f"e{i}".encode() for i in range(20) if i not in (3, 11)}


async def test_a_record_the_broker_refuses_fails_only_its_request() -> None:
    # the broker's limit below the gateway's: the produce of the whole batch is refused
    client, sinks = backend_app(limit=100_000)
    requests = [binary(i, b"x" * (200_000 if i % 5 == 0 else 10)) for i in range(25)]
    replies = await asyncio.gather(
        *(client.post("/v1/pipelines/big/events", headers=h, content=b) for h, b in requests)
    )
    assert [r.status_code for r in replies] == [413 if i % 5 == 0 else 202 for i in range(25)]
    assert "MessageSizeTooLargeError" in replies[0].json()["error"]
    assert "was refused by the broker" in replies[0].json()["error"]
    (sink,) = sinks
    assert any(len(s) > 1 and any(len(r.value) > 100_000 for r in s) for s in sink.sends), (
        "the oversize records were not batched with others: the test proves nothing"
    )
    acked = sorted(int(dict(r.headers)["ce_id"][1:]) for r in sink.acked)
    assert acked == [i for i in range(25) if i % 5]


# -- 6. data_schema regexes run with RE2 ----------------------------------------------------
EVIL = r"^([a-zA-Z0-9]+)*@example\.com$"


def schema_app(schema: dict[str, Any]) -> httpx.AsyncClient:
    d = [pipeline_doc("schemed", [{"http": {"data_schema": schema}}])]
    app = build_http_app(Ingress(MemoryBackend(d), RouteTable.from_documents(d, {})))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


# ~77 s for a backtracking engine (x2 per character: 24 of them take ~1.2 s), microseconds
# for RE2
EVIL_TEXT = "a" * 30 + "!"
GOOD_TEXT = "bob@example.com"


@pytest.mark.parametrize(
    ("schema", "bad", "bad_status", "good"),
    [
        (
            {"type": "object", "properties": {"email": {"type": "string", "pattern": EVIL}}},
            {"email": EVIL_TEXT},
            422,
            {"email": GOOD_TEXT},
        ),
        (
            {"type": "object", "patternProperties": {EVIL: {"type": "integer"}}},
            {EVIL_TEXT: "x"},
            202,  # no key matches: nothing to check, but the search must be fast
            {GOOD_TEXT: 1},
        ),
        (
            {"type": "object", "patternProperties": {EVIL: {}}, "additionalProperties": False},
            {EVIL_TEXT: 1},
            422,
            {GOOD_TEXT: 1},
        ),
        (
            {"type": "object", "propertyNames": {"pattern": EVIL}},
            {EVIL_TEXT: 1},
            422,
            {GOOD_TEXT: 1},
        ),
    ],
)
async def test_a_backtracking_pattern_answers_fast(
    schema: dict[str, Any], bad: dict[str, Any], bad_status: int, good: dict[str, Any]
) -> None:
    client = schema_app(schema)
    json = {"content-type": "application/json"}
    started = time.perf_counter()
    r = await client.post("/v1/pipelines/schemed/events", headers=json, content=orjson.dumps(bad))
    assert time.perf_counter() - started < SLOW_S
    assert r.status_code == bad_status, r.text
    r = await client.post("/v1/pipelines/schemed/events", headers=json, content=orjson.dumps(good))
    assert r.status_code == 202, r.text


def test_patterns_match_as_json_schema_says() -> None:
    from eventbus.eventing.sources._data_schema import data_validator

    v = data_validator(
        {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "free": {"pattern": "b"},
            },
            "patternProperties": {"^x-": {"type": "integer"}},
            "additionalProperties": False,
        }
    )
    assert v.is_valid({"code": "EUR", "x-n": 1, "free": "abc"})  # pattern is a search
    assert not v.is_valid({"code": "EURO"})
    assert not v.is_valid({"x-n": "one"})
    assert not v.is_valid({"other": 1})
    assert v.is_valid({"code": "EUR", "free": 5})  # pattern ignores non-strings
    assert data_validator({"pattern": "é$"}).is_valid("café")


@pytest.mark.parametrize(
    ("schema", "expect"),
    [
        (
            {"type": "string", "pattern": r"(a)\1"},
            "pattern '(a)\\\\1' is not an RE2 regular expression",
        ),
        ({"patternProperties": {"(?=x)": {}}}, "pattern '(?=x)' is not an RE2 regular expression"),
        ({"$defs": {"a": {"items": {"pattern": "(?!x)"}}}}, "pattern '(?!x)' is not an RE2"),
        (
            {"patternProperties": {"^x": {}}, "unevaluatedProperties": False},
            "unevaluatedProperties and patternProperties together",
        ),
    ],
)
def test_a_pattern_re2_cannot_run_is_refused_at_validate_time(
    schema: dict[str, Any], expect: str
) -> None:
    import re

    from pydantic import ValidationError

    from eventbus.eventing.sources._http_config import HttpSourceConfig

    with pytest.raises(ValidationError, match=re.escape(expect)):
        HttpSourceConfig(data_schema=schema)


def test_data_keywords_are_not_taken_for_patterns() -> None:
    from eventbus.eventing.sources._http_config import HttpSourceConfig

    schema = {"const": {"pattern": "(a)\\1"}, "properties": {"pattern": {"type": "string"}}}
    assert HttpSourceConfig(data_schema=schema).data_schema == schema


# -- 8. bodies: too large, lying, slow, many events, bad bytes -------------------------------
def limited_client() -> httpx.AsyncClient:
    d = [pipeline_doc("small", [{"http": {"path": "/hooks/small", "max_body_bytes": 2048}}])]
    app = build_http_app(Ingress(MemoryBackend(d), RouteTable.from_documents(d, {})))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def chunks(n: int, size: int):
    for _ in range(n):
        yield b"x" * size


@pytest.mark.parametrize("path", ["/v1/pipelines/small/events", "/hooks/small"])
async def test_a_chunked_body_over_the_limit_is_413(path: str) -> None:
    client = limited_client()
    started = time.perf_counter()
    r = await client.post(path, content=chunks(1000, 1024))  # no content-length
    assert time.perf_counter() - started < FAST_S
    assert r.status_code == 413 and "over 2048 bytes" in r.json()["error"]
    assert r.headers["connection"] == "close"


async def test_a_content_length_that_lies_is_not_believed() -> None:
    client = limited_client()
    r = await client.post(
        "/v1/pipelines/small/events", headers={"content-length": "10"}, content=b"x" * 5000
    )
    assert r.status_code == 413, r.text
    r = await client.post(
        "/v1/pipelines/small/events", headers={"content-length": "10**9"}, content=b"{}"
    )
    assert r.status_code == 400 and "it must be a byte count" in r.json()["error"]


@pytest.mark.parametrize("path", ["/v1/pipelines/small/events", "/hooks/small"])
async def test_a_body_that_stops_arriving_is_408(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    import eventbus.gateway._http_io as http_io

    monkeypatch.setattr(http_io, "BODY_TIMEOUT_S", 0.2)
    never = asyncio.Event()

    async def slowloris():
        yield b'{"a": '
        await never.wait()
        yield b"1}"

    client = limited_client()
    started = time.perf_counter()
    r = await client.post(path, content=slowloris())
    # the 0.2 s timeout, not the default BODY_TIMEOUT_S (30 s) nor none (never answered)
    assert 0.2 <= time.perf_counter() - started < SLOW_S
    assert r.status_code == 408, r.text
    assert "did not arrive within 0.2 s" in r.json()["error"]
    assert r.headers["connection"] == "close"
    # meanwhile the loop answered others
    r = await client.post(path, json={"a": 1})
    assert r.status_code == 202


async def test_a_batch_of_100k_tiny_events_is_400_fast() -> None:
    d = [pipeline_doc("wide", [{"http": {"max_body_bytes": 64 * 1024 * 1024}}])]
    app = build_http_app(Ingress(MemoryBackend(d), RouteTable.from_documents(d, {})))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    body = orjson.dumps([event(id=str(i)) for i in range(100_000)])
    started = time.perf_counter()
    r = await client.post("/v1/pipelines/wide/events", headers=BATCH, content=body)
    assert time.perf_counter() - started < FAST_S
    assert r.status_code == 400
    assert f"the batch has 100000 events; at most {MAX_BATCH_EVENTS}" in r.json()["error"]
    # a 10 MB string: the body limit (413) or, under a larger one, the record limit (413)
    r = await client.post("/v1/pipelines/wide/events", json={"s": "x" * 10_000_000})
    assert r.status_code == 202  # MemoryBackend keeps it; the real backend sizes records (5.)
    r = await client.post(
        "/v1/pipelines/wide/events",
        headers=STRUCTURED,
        content=orjson.dumps(event(id="x" * 10_000_000)),
    )
    assert r.status_code == 400 and len(r.text) < 1000


@pytest.mark.parametrize(
    ("headers", "body", "expect"),
    [
        (CE, b'{"amount": "\xff\xfe"}', "body is not valid JSON (str is not valid UTF-8"),
        ({"content-type": "application/json"}, b"\xff\xfe", "body is not valid JSON"),
        (STRUCTURED, b'{"specversion": "1.0", "id": "\xc3"}', "body is not valid JSON"),
        (CE, b'{"amount": NaN}', "body is not valid JSON"),
        (CE, b'{"amount": Infinity}', "body is not valid JSON"),
        (CE, b'{"amount": 1e400}', "body is not valid JSON"),
        ({"content-type": "application/json"}, b"[-Infinity]", "body is not valid JSON"),
    ],
)
async def test_bad_bytes_and_non_json_numbers_are_400(
    client: httpx.AsyncClient, headers: dict[str, str], body: bytes, expect: str
) -> None:
    r = await post(client, ASYNC, headers, body)
    assert r.status_code == 400, r.text
    assert expect in r.json()["error"]


async def test_duplicate_keys_keep_the_last_value(client: httpx.AsyncClient, ingress) -> None:
    # RFC 8259 leaves duplicate names to the parser; orjson (and so EventBus) keeps the last,
    # for data and for attributes alike: documented, not refused (finding them costs a
    # second parse of every body).
    body = b'{"specversion":"1.0","id":"a","id":"b","source":"/s","type":"t","data":{"k":1,"k":2}}'
    r = await post(client, ASYNC, STRUCTURED, body)
    assert r.status_code == 202 and r.json()["ids"] == ["b"]
    assert ingress.backend.published["open"][-1].data == {"k": 2}
