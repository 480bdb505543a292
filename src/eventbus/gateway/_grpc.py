"""The gateway's gRPC face: ``eventbus.v1.EventBus`` over the CloudEvents protobuf format.

``Publish(CloudEventBatch) returns (PublishReply)`` accepts events durably;
``Invoke(CloudEvent) returns (CloudEventBatch)`` runs one event through the pipeline. The
pipeline is named in the ``x-eventbus-pipeline`` metadata. Status codes mirror the HTTP ones:
400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND,
413 RESOURCE_EXHAUSTED, 422 FAILED_PRECONDITION, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED.

``Invoke`` of a pipeline scaled to zero (``replicas.min: 0``) wakes it and waits for the cold
start within the call's deadline (and the source's ``timeout_ms``); when that is too short it
answers UNAVAILABLE just before the deadline, with ``retry-after`` (seconds) and
``grpc-retry-pushback-ms`` trailing metadata, as HTTP answers 503 with ``Retry-After``.
"""

from __future__ import annotations

import math
from typing import Any

import grpc

from eventbus.errors import EventDecodeError, IngressError
from eventbus.eventing._proto import cloudevents_pb2 as pb
from eventbus.eventing._proto import eventbus_pb2, eventbus_pb2_grpc
from eventbus.eventing._protobuf import (
    event_from_proto,
    events_from_proto_batch,
    events_to_proto_batch,
)
from eventbus.gateway._auth import answer_sync
from eventbus.gateway._ingress import MAX_ATTRIBUTE_CHARS, MAX_BATCH_EVENTS, Ingress, split_outcomes
from eventbus.gateway._routes import Route

__all__ = [
    "DEADLINE_MARGIN_S",
    "PIPELINE_METADATA",
    "build_grpc_server",
    "grpc_status",
    "retry_metadata",
]

PIPELINE_METADATA = "x-eventbus-pipeline"
#: ``Invoke`` answers this long (at most a quarter of the call's time) before the call's
#: deadline: a pipeline still waking gets UNAVAILABLE with its retry metadata, which the
#: caller receives, rather than the caller's own DEADLINE_EXCEEDED without them.
DEADLINE_MARGIN_S = 0.25
_MAX_MESSAGE = 64 * 1024 * 1024
#: Most bytes of a call's metadata (as the HTTP face's header limit); grpc refuses a larger
#: call with RESOURCE_EXHAUSTED before it reaches the servicer.
MAX_METADATA_BYTES = 16 * 1024
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.FAILED_PRECONDITION,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def retry_metadata(exc: IngressError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata of an error that says when to retry (a pipeline at zero, waking):
    ``retry-after`` in whole seconds (as the HTTP face's header) and
    ``grpc-retry-pushback-ms``, which gRPC clients with a retry policy wait before retrying."""
    if exc.retry_after_s is None:
        return ()
    return (
        ("retry-after", str(max(1, math.ceil(exc.retry_after_s)))),
        ("grpc-retry-pushback-ms", str(max(0, round(exc.retry_after_s * 1000)))),
    )


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: IngressError) -> None:
    await context.abort(grpc_status(exc.status), exc.message, trailing_metadata=retry_metadata(exc))


def grpc_status(http_status: int) -> grpc.StatusCode:
    """The gRPC status code mirroring an HTTP status."""
    return _CODES.get(http_status, grpc.StatusCode.INTERNAL)


class _Servicer(eventbus_pb2_grpc.EventBusServicer):
    def __init__(self, ingress: Ingress) -> None:
        self._ingress = ingress

    async def _route(
        self, context: grpc.aio.ServicerContext[Any, Any], size: int
    ) -> tuple[Route, dict[str, str]]:
        metadata = {
            k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)
        }
        name = metadata.get(PIPELINE_METADATA)
        if not name:
            raise IngressError(
                400, f"name the pipeline in the {PIPELINE_METADATA} metadata of the call"
            )
        route = await self._ingress.route("grpc", name)
        limit = route.config.max_body_bytes
        if size > limit:
            raise IngressError(
                413,
                f"the message is {size} bytes; pipeline {name!r} takes at most {limit} (max_body_bytes of its grpc source)",
            )
        await self._ingress.authenticate(route, metadata, b"")
        return route, metadata

    async def Publish(
        self, request: pb.CloudEventBatch, context: grpc.aio.ServicerContext[Any, Any]
    ) -> eventbus_pb2.PublishReply:
        try:
            route, _ = await self._route(context, request.ByteSize())
            n = len(request.events)
            if not n:
                raise IngressError(400, "the batch is empty; send at least one event")
            if n > MAX_BATCH_EVENTS:
                raise IngressError(
                    400,
                    f"the batch has {n} events; at most {MAX_BATCH_EVENTS} are taken per call: "
                    "split it into several calls",
                )
            try:
                events = events_from_proto_batch(request, max_attribute_chars=MAX_ATTRIBUTE_CHARS)
            except EventDecodeError as e:
                raise IngressError(400, str(e)) from None
            self._ingress.validate(route, events)
            await self._ingress.publish(route, events)
            return eventbus_pb2.PublishReply(accepted=len(events))
        except IngressError as e:
            await _abort(context, e)
            raise  # unreachable: abort raises

    async def Invoke(
        self, request: pb.CloudEvent, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CloudEventBatch:
        try:
            route, _ = await self._route(context, request.ByteSize())
            answer_sync(route.pipeline, "grpc", route.config.mode, True)
            try:
                event = event_from_proto(request, max_attribute_chars=MAX_ATTRIBUTE_CHARS)
            except EventDecodeError as e:
                raise IngressError(400, str(e)) from None
            self._ingress.validate(route, [event])
            # Answer before the caller gives up: a pipeline scaled to zero gets the deadline
            # for its cold start, less a margin for the answer to travel back.
            remaining = context.time_remaining()
            deadline_s = None
            if remaining is not None:
                deadline_s = remaining - min(DEADLINE_MARGIN_S, remaining / 4)
            outcomes = await self._ingress.invoke(route, [event], deadline_s=deadline_s)
            return events_to_proto_batch(split_outcomes(route.pipeline, [event], outcomes))
        except IngressError as e:
            await _abort(context, e)
            raise


def build_grpc_server(
    ingress: Ingress, address: str, options: list[tuple[str, Any]] | None = None
) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server serving ``eventbus.v1.EventBus`` on ``address`` (``host:port``;
    port 0 picks a free one). Returns the server (not started) and the bound port."""
    server = grpc.aio.server(
        # so_reuseport 0: a port another process holds is an error here, not a silent share.
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.max_metadata_size", MAX_METADATA_BYTES),
            ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
            ("grpc.so_reuseport", 0),
            *(options or []),
        ]
    )
    eventbus_pb2_grpc.add_EventBusServicer_to_server(_Servicer(ingress), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port(address)
    return server, port
