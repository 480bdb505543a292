"""The gateway's gRPC face over an in-process backend, with the generated client stub."""

from __future__ import annotations

import asyncio
import time

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


class _ColdBackend:
    """A pipeline's replicas starting: every invoke waits ``start_s``, then runs the steps."""

    def __init__(self, inner, start_s: float) -> None:
        self.inner = inner
        self.start_s = start_s

    async def publish(self, pipeline, events):
        await self.inner.publish(pipeline, events)

    async def invoke(self, pipeline, events):
        await asyncio.sleep(self.start_s)
        return await self.inner.invoke(pipeline, events)


@pytest.fixture
async def cold_stub(ingress_factory):
    """A gateway whose pipeline ``echo`` is scaled to zero; ``stub.start_s`` is its cold start."""
    ingress, backend = ingress_factory()
    cold = _ColdBackend(backend, start_s=0.4)
    ingress.backend = cold
    ingress.scaled_to_zero = frozenset({"echo"})
    woken: list[str] = []

    async def wake(name: str) -> None:
        woken.append(name)

    ingress.wake = wake
    server, port = build_grpc_server(ingress, "127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    s = eventbus_pb2_grpc.EventBusStub(channel)
    s.cold, s.woken, s.ingress = cold, woken, ingress
    yield s
    await channel.close()
    await server.stop(0)


async def test_invoke_at_zero_waits_for_the_cold_start_within_the_deadline(cold_stub) -> None:
    md = [("x-eventbus-pipeline", "echo")]
    out = await cold_stub.Invoke(event_to_proto(ev(1, 500)), metadata=md, timeout=3)
    (e,) = [event_from_proto(m) for m in out.events]
    assert e.data["amount_cny"] == 3500.0 and cold_stub.woken == ["echo"]


async def test_invoke_at_zero_past_the_deadline_is_unavailable_with_retry_metadata(
    cold_stub,
) -> None:
    cold_stub.cold.start_s = 30.0
    md = [("x-eventbus-pipeline", "echo")]
    started = time.monotonic()
    call = cold_stub.Invoke(event_to_proto(ev(1, 500)), metadata=md, timeout=1.0)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    took = time.monotonic() - started
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
    assert "was scaled to zero (replicas.min: 0) and is starting" in info.value.details()
    assert "the call's deadline" in info.value.details()
    trailing = dict(info.value.trailing_metadata() or ())
    assert trailing["retry-after"] == "5" and trailing["grpc-retry-pushback-ms"] == "5000"
    # answered a margin short of the caller's deadline (UNAVAILABLE, not DEADLINE_EXCEEDED,
    # says it came before the deadline), not at once
    assert took >= 0.7
    # a warm pipeline past the call's deadline: DEADLINE_EXCEEDED from the gateway, no retry
    cold_stub.ingress.scaled_to_zero = frozenset()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await cold_stub.Invoke(event_to_proto(ev(2, 500)), metadata=md, timeout=0.5)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "did not answer within the call's deadline" in info.value.details()
    assert "retry-after" not in dict(info.value.trailing_metadata() or ())


async def test_many_calls_at_zero_each_get_their_answer_or_their_retry(cold_stub) -> None:
    """200 concurrent calls while the pipeline wakes: short deadlines are told to retry,
    long ones are answered; none hangs past its deadline."""
    md = [("x-eventbus-pipeline", "echo")]
    cold_stub.cold.start_s = 2.5

    async def one(i: int) -> str:
        timeout = 1.5 if i % 2 else 8.0
        try:
            out = await cold_stub.Invoke(event_to_proto(ev(i, 500)), metadata=md, timeout=timeout)
            return "ok" if len(out.events) == 1 else "empty"
        except grpc.aio.AioRpcError as e:
            return e.code().name

    codes = await asyncio.gather(*(one(i) for i in range(200)))
    assert codes[::2] == ["ok"] * 100
    # the gateway answers 250 ms before each short deadline: on a machine so loaded that its
    # loop stalls longer than that, a caller's own deadline may fire first (still no hang)
    assert set(codes[1::2]) <= {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
    assert codes[1::2].count("UNAVAILABLE") >= 90, codes[1::2]
    # no wall-clock bound: a call held to its deadline shows in the codes above (the long
    # ones would be DEADLINE_EXCEEDED, the short ones not UNAVAILABLE)
