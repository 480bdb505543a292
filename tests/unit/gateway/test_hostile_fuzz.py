"""Hostile-input fuzzing of the gateway's HTTP and gRPC faces, headers and metadata included.

Whatever a client sends (any header, any content type, any body, deep or huge JSON, CloudEvent
attributes of the wrong JSON type, out-of-range protobuf timestamps), the gateway answers with
a client error or success, never a server error (5xx / gRPC UNKNOWN or INTERNAL), and never
takes a second for one request. The schemathesis run in ``test_openapi_fuzz.py`` covers the
admin API's documented operations; this one throws what the OpenAPI document cannot describe.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus.eventing._proto import cloudevents_pb2 as pb
from eventbus.eventing._proto import eventbus_pb2_grpc
from eventbus.gateway._grpc import build_grpc_server
from eventbus.gateway._http import build_http_app
from eventbus.gateway._ingress import Ingress
from eventbus.gateway._routes import RouteTable
from tests.unit.gateway.conftest import ENV, MemoryBackend, default_docs

#: one request slower than this fails the property: milliseconds when right, a timeout
#: (10 s and more) or a hang when wrong; generous enough for a loaded 2-core machine
MAX_SECONDS = 5.0
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)

PIPELINES = ["open", "orders", "payments", "kafka-only", "nope", "Bad Name", "a" * 300]
ATTRIBUTES = [
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "dataschema",
    "datacontenttype",
    "traceparent",
    "tracestate",
    "partitionkey",
    "x",
]
CONTENT_TYPES = [
    "application/json",
    "application/cloudevents+json",
    "application/cloudevents-batch+json",
    "application/cloudevents+json; charset=utf-8",
    "text/plain",
    "application/octet-stream",
    "application/json; charset=latin-1",
    "",
    "a" * 5000,
]

# Header values as bytes: anything a real HTTP/1.1 server would hand the app (no CR, LF, NUL).
header_value = st.one_of(
    st.binary(max_size=64).map(
        lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b"\0", b"")
    ),
    st.text(max_size=64).map(lambda s: s.encode("utf-8", "replace")),
    st.sampled_from(
        [b"1.0", b"0.3", b"2.0", b"", b"%", b"%zz", b"%C3%28", b"t=1,v1=00", b"x" * 70_000]
    ),
)
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # orjson refuses ints over 64 bits: clients need not


def _deep(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def _structured(attrs: dict[str, Any], data: Any) -> dict[str, Any]:
    return {"specversion": "1.0", "id": "f1", "source": "/fuzz", "type": "t", **attrs, "data": data}


structured_event = st.builds(
    _structured, st.dictionaries(st.sampled_from(ATTRIBUTES), json_value, max_size=4), json_value
)
body = st.one_of(
    st.binary(max_size=256),
    json_value.map(_dumps),
    structured_event.map(_dumps),
    st.lists(st.one_of(structured_event, json_value), max_size=5).map(_dumps),
    st.builds(_deep, st.integers(min_value=100, max_value=3000), st.sampled_from(["list", "map"])),
    st.sampled_from(
        [
            b'{"amount": NaN}',
            b'{"amount": Infinity}',
            b'{"a": 1, "a": 2}',
            b'"\xff\xfe"',
            b'{"amount": 1e999999}',
            b"[" + b"{}," * 20_000 + b"{}]",
            b'{"amount": ' + b"9" * 5000 + b"}",
            b'{"s": "' + b"a" * 3_000_000 + b'"}',
        ]
    ),
)


@st.composite
def http_request(draw: st.DrawFn) -> tuple[str, dict[bytes, bytes], bytes]:
    name = draw(st.sampled_from(PIPELINES))
    path = draw(
        st.sampled_from(
            [
                f"/v1/pipelines/{name}/events",
                f"/v1/pipelines/{name}/events?wait=true",
                f"/v1/pipelines/{name}/events?wait=%ff&wait=1",
                "/hooks/open",
                "/hooks/open?wait=true",
            ]
        )
    )
    headers: dict[bytes, bytes] = {b"content-type": draw(st.sampled_from(CONTENT_TYPES)).encode()}
    for attr in draw(st.lists(st.sampled_from(ATTRIBUTES), max_size=6)):
        headers[f"ce-{attr}".encode()] = draw(header_value)
    if draw(st.booleans()):
        headers[b"authorization"] = draw(
            st.one_of(header_value, st.sampled_from([b"Bearer pay-token", b"Bearer ", b"Basic x"]))
        )
    if draw(st.booleans()):
        headers[b"x-eventbus-signature"] = draw(
            st.one_of(
                header_value,
                st.sampled_from(["t=²,v1=00", "t=" + "9" * 5000 + ",v1=00", "t=1,v1=zz"]).map(
                    str.encode
                ),
            )
        )
    if draw(st.booleans()):
        headers[b"origin"] = draw(header_value)
    return path, headers, draw(body)


def _app() -> Any:
    docs = [d for d in default_docs() if d["metadata"]["name"] != "broken"]  # its 503 is on purpose
    return build_http_app(Ingress(MemoryBackend(docs), RouteTable.from_documents(docs, ENV)))


def test_no_http_request_gives_a_server_error_or_takes_a_second() -> None:
    loop = asyncio.new_event_loop()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://gw")

    @given(request=http_request())
    @FUZZ
    def run(request: tuple[str, dict[bytes, bytes], bytes]) -> None:
        path, headers, content = request
        start = time.perf_counter()
        r = loop.run_until_complete(client.post(path, headers=headers, content=content))
        took = time.perf_counter() - start
        assert r.status_code < 500, (path, headers, content[:200], r.status_code, r.text[:300])
        assert took < MAX_SECONDS, (path, took)

    try:
        run()
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


timestamp = st.builds(
    lambda s, n: {"seconds": s, "nanos": n},
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
)
attr_value = st.one_of(
    st.booleans().map(lambda v: {"ce_boolean": v}),
    st.integers(min_value=-(2**31), max_value=2**31 - 1).map(lambda v: {"ce_integer": v}),
    st.text(max_size=40).map(lambda v: {"ce_string": v}),
    st.binary(max_size=40).map(lambda v: {"ce_bytes": v}),
    st.text(max_size=40).map(lambda v: {"ce_uri": v}),
    st.text(max_size=40).map(lambda v: {"ce_uri_ref": v}),
    timestamp.map(lambda v: {"ce_timestamp": v}),
    st.just({"ce_string": "x" * 70_000}),
)


@st.composite
def proto_event(draw: st.DrawFn) -> pb.CloudEvent:
    text = st.one_of(st.text(max_size=30), st.sampled_from(["1.0", "", "x" * 70_000]))
    e = pb.CloudEvent(id=draw(text), source=draw(text), spec_version=draw(text), type=draw(text))
    for name in draw(
        st.lists(st.one_of(st.sampled_from(ATTRIBUTES), st.text(max_size=12)), max_size=4)
    ):
        e.attributes[name].CopyFrom(pb.CloudEvent.CloudEventAttributeValue(**draw(attr_value)))
    data = draw(st.integers(min_value=0, max_value=3))
    if data == 1:
        e.binary_data = draw(st.binary(max_size=64))
    elif data == 2:
        e.text_data = draw(
            st.one_of(
                st.text(max_size=64),
                st.builds(_deep, st.integers(100, 3000), st.just("list")).map(bytes.decode),
            )
        )
    elif data == 3:
        e.text_data = _dumps(draw(json_value)).decode()
    return e


SERVER_FAULTS = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS}


@pytest.mark.parametrize("method", ["Publish", "Invoke"])
def test_no_grpc_call_gives_a_server_fault_or_takes_a_second(method: str) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # grpc.aio binds its channel and server to the current loop
    docs = [d for d in default_docs() if d["metadata"]["name"] != "broken"]

    async def start() -> tuple[Any, Any, Any]:
        server, port = build_grpc_server(
            Ingress(MemoryBackend(docs), RouteTable.from_documents(docs, ENV)), "127.0.0.1:0"
        )
        await server.start()
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
        )
        return server, channel, eventbus_pb2_grpc.EventBusStub(channel)

    server, channel, stub = loop.run_until_complete(start())

    @given(
        events=st.lists(proto_event(), min_size=0 if method == "Publish" else 1, max_size=3),
        name=st.sampled_from(PIPELINES),
        auth=st.sampled_from([None, "Bearer pay-token", "Bearer x", "Basic", "\u00e9"]),
    )
    @FUZZ
    def run(events: list[pb.CloudEvent], name: str, auth: str | None) -> None:
        metadata = [("x-eventbus-pipeline", name)]
        if auth is not None and auth.isascii():
            metadata.append(("authorization", auth))
        message = pb.CloudEventBatch(events=events) if method == "Publish" else events[0]
        start = time.perf_counter()
        try:
            loop.run_until_complete(getattr(stub, method)(message, metadata=metadata, timeout=5))
        except grpc.aio.AioRpcError as e:
            assert e.code() not in SERVER_FAULTS, (e.code(), e.details(), str(message)[:300])
        took = time.perf_counter() - start
        assert took < MAX_SECONDS, (method, took)

    try:
        run()
    finally:
        loop.run_until_complete(channel.close())
        loop.run_until_complete(server.stop(0))
        asyncio.set_event_loop(None)
        loop.close()


#: Known attacks, each sent as is (the random search above may not draw them), with the answer
#: each must get.
EXPECTED = {
    "hmac timestamp with a superscript digit": 401,
    "hmac timestamp of 5,000 digits": 401,
    "json nested 300 deep, async": 400,
    "json nested 300 deep, sync": 400,
    "json nested 100,000 deep": 400,
    "a 70 KB ce-id": 431,
    "a number as traceparent": 400,
    "an object as id": 400,
    "a batch of 100,000 tiny events": 413,
    "invalid utf-8 in a json body": 400,
    "a 4,400-digit number": 400,
}
KNOWN = {
    "hmac timestamp with a superscript digit": (
        "/v1/pipelines/orders/events",
        {b"x-eventbus-signature": "t=²,v2=00".encode()},
        b'{"amount": 1}',
    ),
    "hmac timestamp of 5,000 digits": (
        "/v1/pipelines/orders/events",
        {b"x-eventbus-signature": b"t=" + b"9" * 5000 + b",v2=00"},
        b'{"amount": 1}',
    ),
    "json nested 300 deep, async": ("/v1/pipelines/open/events", {}, _deep(300, "list")),
    "json nested 300 deep, sync": (
        "/v1/pipelines/payments/events?wait=true",
        {b"authorization": b"Bearer pay-token"},
        _deep(300, "map"),
    ),
    "json nested 100,000 deep": ("/hooks/open", {}, _deep(100_000, "list")),
    "a 70 KB ce-id": (
        "/v1/pipelines/open/events",
        {b"ce-specversion": b"1.0", b"ce-id": b"i" * 70_000, b"ce-source": b"/s", b"ce-type": b"t"},
        b"{}",
    ),
    "a number as traceparent": (
        "/hooks/open",
        {b"content-type": b"application/cloudevents+json"},
        _dumps(_structured({"traceparent": 7}, {})),
    ),
    "an object as id": (
        "/hooks/open",
        {b"content-type": b"application/cloudevents+json"},
        _dumps(_structured({"id": {"a": 1}}, {})),
    ),
    "a batch of 100,000 tiny events": (
        "/hooks/open",
        {b"content-type": b"application/cloudevents-batch+json"},
        _dumps([_structured({"id": str(i)}, None) for i in range(100_000)]),
    ),
    "invalid utf-8 in a json body": ("/hooks/open", {}, b'{"s": "\xff\xfe"}'),
    "a 4,400-digit number": ("/hooks/open", {}, b'{"amount": ' + b"9" * 4400 + b"}"),
}


@pytest.mark.parametrize("name", list(KNOWN))
def test_known_attacks_get_a_client_error_fast(name: str) -> None:
    path, headers, content = KNOWN[name]
    headers = {b"content-type": b"application/json", **headers}

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.post(path, headers=headers, content=content)

    start = time.perf_counter()
    r = asyncio.run(send())
    took = time.perf_counter() - start
    assert r.status_code == EXPECTED[name], (r.status_code, r.text[:300])
    assert took < MAX_SECONDS, took
