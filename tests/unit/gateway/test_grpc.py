"""The gateway's gRPC face over an in-process backend, with the generated client stub."""

from __future__ import annotations

import grpc
import pytest

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._proto import cloudevents_pb2 as pb
from eventbus.eventing._proto import eventbus_pb2_grpc
from eventbus.eventing._protobuf import event_from_proto, event_to_proto, events_to_proto_batch
from eventbus.gateway._grpc import build_grpc_server


@pytest.fixture
async def stub(ingress_factory):
    ingress, backend = ingress_factory()
    server, port = build_grpc_server(ingress, "127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    s = eventbus_pb2_grpc.EventBusStub(channel)
    s.backend = backend
    yield s
    await channel.close()
    await server.stop(0)


def ev(i: int, amount: int) -> CloudEvent:
    return CloudEvent.create(
        type="payment.created",
        source="/shop",
        id=f"g{i}",
        data={"amount": amount},
        time="2024-05-01T12:00:00Z",
        partitionkey="k1",
    )


def test_protobuf_round_trip_keeps_attributes_and_data() -> None:
    e = ev(1, 5).replace(subject="s", flag=True, count=3)
    back = event_from_proto(pb.CloudEvent.FromString(event_to_proto(e).SerializeToString()))
    assert back.attributes == {**e.attributes}
    assert back.data == e.data
    raw = CloudEvent.create(
        type="t", source="/s", id="b", data=b"\x00\x01", datacontenttype="application/octet-stream"
    )
    assert event_from_proto(event_to_proto(raw)).data == b"\x00\x01"


async def test_publish_accepts_a_batch(stub) -> None:
    reply = await stub.Publish(
        events_to_proto_batch([ev(i, 500) for i in range(3)]),
        metadata=[("x-eventbus-pipeline", "open")],
    )
    assert reply.accepted == 3
    assert [e.id for e in stub.backend.published["open"]] == ["g0", "g1", "g2"]
    assert stub.backend.published["open"][0].attributes["partitionkey"] == "k1"


async def test_invoke_returns_outputs(stub) -> None:
    out = await stub.Invoke(
        event_to_proto(ev(1, 500)), metadata=[("x-eventbus-pipeline", "echo")], timeout=5
    )
    (e,) = [event_from_proto(m) for m in out.events]
    assert e.type == "payment.large" and e.data["amount_cny"] == 3500.0
    empty = await stub.Invoke(
        event_to_proto(ev(2, 5)), metadata=[("x-eventbus-pipeline", "echo")], timeout=5
    )
    assert len(empty.events) == 0


@pytest.mark.parametrize(
    ("metadata", "message", "code", "text"),
    [
        ([], None, grpc.StatusCode.INVALID_ARGUMENT, "x-eventbus-pipeline"),
        (
            [("x-eventbus-pipeline", "nope")],
            None,
            grpc.StatusCode.NOT_FOUND,
            "no pipeline named 'nope'",
        ),
        (
            [("x-eventbus-pipeline", "payments")],
            None,
            grpc.StatusCode.UNAUTHENTICATED,
            "bearer token",
        ),
        (
            [("x-eventbus-pipeline", "echo")],
            pb.CloudEvent(id="x", source="/s", spec_version="1.0"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "attribute 'type' is missing",
        ),
    ],
)
async def test_errors_mirror_http_statuses(stub, metadata, message, code, text) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Invoke(message or event_to_proto(ev(1, 500)), metadata=metadata, timeout=5)
    assert info.value.code() == code
    assert text in info.value.details()


async def test_bearer_token_passes(stub) -> None:
    out = await stub.Invoke(
        event_to_proto(ev(1, 500)),
        metadata=[("x-eventbus-pipeline", "payments"), ("authorization", "Bearer pay-token")],
        timeout=5,
    )
    assert len(out.events) == 1
