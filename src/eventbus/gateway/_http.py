"""The gateway's HTTP face: a FastAPI app over an :class:`Ingress`.

``POST /v1/pipelines/{name}/events`` and every ``path:`` an ``http`` source declares take
CloudEvents in the HTTP binding's binary, structured and batch modes, or plain JSON. Async
(default): 202 once the events are durably accepted. Sync (``?wait=true`` or the source's
``mode: sync``): the outputs, binary mode for one, batch mode for several, 204 for none.
Errors: a JSON body ``{"error": "...", "status": N}`` with 400, 401, 403, 404, 408, 413, 422,
431, 503 or 504.

Limits on what a request may be (each refused with a 4xx naming the limit, before any work
that grows with it): headers :data:`MAX_HEADER_BYTES` in all (431), an attribute
``MAX_ATTRIBUTE_CHARS`` and a batch ``MAX_BATCH_EVENTS`` (400, in ``_ingress``), JSON nested at
most ``MAX_JSON_DEPTH`` (128) levels (400, in the codecs), the body the source's
``max_body_bytes`` as it arrives (413) within :data:`BODY_TIMEOUT_S` (408), one Kafka record
``MAX_RECORD_BYTES`` (413, in ``_backend``). Duplicate JSON keys are not refused: the last one
counts. uvicorn's httptools parser bounds neither header size nor the time headers take to
arrive; the server's configuration has to (see ``_server``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.routing import Route as StarletteRoute

from eventbus.errors import IngressError
from eventbus.eventing._http_codec import encode_http_batch, encode_http_binary
from eventbus.gateway._auth import answer_sync
from eventbus.gateway._ingress import Ingress, Route, split_outcomes
from eventbus.gateway._replies import JSON_HEADERS, Reply, error_reply, to_response
from eventbus.observability._tracing import end_spans, start_event_spans, tracer

__all__ = ["MAX_HEADER_BYTES", "build_http_app"]

log = logging.getLogger("eventbus.gateway")

#: Most bytes of a request's header names and values together (431 above), on every route.
#: Each CloudEvent attribute is held to MAX_ATTRIBUTE_CHARS besides (400).
MAX_HEADER_BYTES = 16 * 1024
#: Longest a request's body may take to arrive, in seconds (408 after, and the connection is
#: closed): a client trickling its body holds a connection and a buffer, not the loop.
BODY_TIMEOUT_S = 30.0
# Answers sent before the body was read whole: the connection cannot serve another request.
_CLOSE_AFTER = frozenset((408, 413, 431))

_CE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["specversion", "id", "source", "type"],
    "properties": {
        "specversion": {"type": "string", "enum": ["1.0"]},
        "id": {"type": "string", "minLength": 1},
        "source": {"type": "string", "minLength": 1},
        "type": {"type": "string", "minLength": 1},
        "subject": {"type": "string"},
        "time": {"type": "string", "format": "date-time"},
        "datacontenttype": {"type": "string"},
        "data": {},
    },
}
_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A CloudEvent (binary mode: ce-* headers and the data as body; structured "
        "mode; or a batch), or a plain JSON body that is wrapped into a CloudEvent.",
        "content": {
            "application/json": {"schema": {}},
            "application/cloudevents+json": {"schema": _CE_SCHEMA},
            "application/cloudevents-batch+json": {
                "schema": {"type": "array", "items": _CE_SCHEMA}
            },
        },
    },
}
_ERROR = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {"error": {"type": "string"}, "status": {"type": "integer"}},
            }
        }
    }
}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Sync: the output events (binary mode for one, batch mode for several)."},
    202: {
        "description": "Async: accepted durably.",
        "content": {"application/json": {"schema": {"type": "object"}}},
    },
    204: {"description": "Sync: the events were filtered out."},
    400: {"description": "Malformed CloudEvent (the attribute is named).", **_ERROR},
    401: {"description": "No or bad credentials.", **_ERROR},
    403: {"description": "Credentials of another pipeline.", **_ERROR},
    404: {"description": "Unknown pipeline or path.", **_ERROR},
    408: {"description": "The body did not arrive within BODY_TIMEOUT_S.", **_ERROR},
    413: {
        "description": "Body over the source's max_body_bytes, or a record over the broker's.",
        **_ERROR,
    },
    422: {"description": "Data fails the source's data_schema, or a step failed (sync).", **_ERROR},
    431: {"description": "Request headers over MAX_HEADER_BYTES in all.", **_ERROR},
    503: {"description": "The broker or the pipeline is unavailable; retry.", **_ERROR},
    504: {"description": "Sync: no answer within the source's timeout_ms.", **_ERROR},
}


def _check_declared_length(declared: str | None, route: Route) -> None:
    if declared is None:
        return
    if not declared.isdigit():
        raise IngressError(400, f"header content-length is {declared!r}; it must be a byte count")
    limit = route.config.max_body_bytes
    if int(declared) > limit:
        raise IngressError(
            413,
            f"the body is {int(declared)} bytes; pipeline {route.pipeline!r} takes at most {limit} (max_body_bytes of its http source): split it into smaller requests",
        )


def _over_limit(limit: int, route: Route) -> str:
    return f"the body is over {limit} bytes, the most pipeline {route.pipeline!r} takes (max_body_bytes of its http source): split it into smaller requests"


def _too_slow() -> IngressError:
    msg = (
        f"the body did not arrive within {BODY_TIMEOUT_S:g} s; send it at once (and a "
        "content-length that matches it)"
    )
    return IngressError(408, msg)


async def _read_body(request: Request, route: Route) -> bytes:
    _check_declared_length(request.headers.get("content-length"), route)
    limit = route.config.max_body_bytes
    chunks = []
    size = 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise IngressError(413, _over_limit(limit, route))
                chunks.append(chunk)
    except TimeoutError:
        raise _too_slow() from None
    return b"".join(chunks)


class _GatewayApp(FastAPI):
    """The FastAPI app, with the event routes answered in front of its middleware stack.

    ``POST /v1/pipelines/{name}/events`` and the ``path:`` of every ``http`` source are what
    the gateway serves per event: they are answered straight from the ASGI scope, without
    FastAPI's and Starlette's layers (routing, middleware, request objects; about half of a
    request's CPU here). Everything else (and an unknown path, so that its 404 is the usual
    one) goes through the app as usual; the same routes stay declared there for the OpenAPI
    document and answer identically.
    """

    events_handler: Callable[[str, str, Any, Any, Any], Awaitable[None]] | None = None
    source_paths: Callable[[], Any] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            size = 0
            for k, v in scope["headers"]:
                size += len(k) + len(v)
            if size > MAX_HEADER_BYTES:
                await _send_reply(send, _headers_too_large(size))
                return
        handler = self.events_handler
        if handler is not None and scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path.startswith("/v1/pipelines/") and path.endswith("/events"):
                name = path[14:-7]
                if name and "/" not in name:
                    await handler("http", name, scope, receive, send)
                    return
            elif self.source_paths is not None and (path.rstrip("/") or "/") in self.source_paths():
                await handler("path", path, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def build_http_app(
    ingress: Ingress, *, title: str = "EventBus gateway", observer: Any = None
) -> FastAPI:
    """The gateway's FastAPI application.

    Args:
        ingress: request handling (routes and backend).
        title: the OpenAPI title.
        observer: an :class:`eventbus.gateway.Observer`: adds ``/metrics``,
            ``/v1/stats``, ``/v1/pipelines/{name}/stats`` and ``/dashboard``, and counts the
            requests (None: none of these).
    """
    app = _GatewayApp(title=title, version="1", docs_url="/docs", redoc_url=None)
    figures = observer.gateway if observer is not None else None

    async def handle(
        route: Route,
        headers: dict[str, str],
        read_body: Callable[[Route], Awaitable[bytes]],
        wait: bool | None,
        scope: Any,
    ) -> Reply:
        if figures is None and tracer() is None:
            return await _handle(route, headers, read_body, wait, None, scope)
        started = perf_counter()
        seen: list[Any] = []  # the decoded events and their spans
        status = 500
        error: BaseException | None = None
        try:
            reply = await _handle(route, headers, read_body, wait, seen, scope)
            status = reply[0]
            return reply
        except IngressError as e:
            status, error = e.status, e
            raise
        except BaseException as e:
            error = e
            raise
        finally:
            if seen:
                end_spans(seen[1], error)
            if figures is not None:
                sync = route.config.mode == "sync" if wait is None else wait
                n = len(seen[0]) if seen and status < 300 else 0
                figures.observe(
                    route.pipeline, "sync" if sync else "async", status, perf_counter() - started, n
                )

    async def _handle(
        route: Route,
        headers: dict[str, str],
        read_body: Callable[[Route], Awaitable[bytes]],
        wait: bool | None,
        seen: list[Any] | None,
        scope: Any,
    ) -> Reply:
        body = await read_body(route)
        query: bytes = scope.get("query_string", b"")
        await ingress.authenticate(
            route,
            headers,
            body,
            method=scope["method"],
            path=scope["path"],
            query=query.decode("latin-1"),
        )
        sync = answer_sync(route.pipeline, "http", route.config.mode, wait)
        events, mode = ingress.decode(route, headers, body)
        if seen is not None:
            spans = start_event_spans(
                f"eventbus.gateway {route.pipeline}",
                events,
                request_traceparent=headers.get("traceparent"),
                attributes={
                    "eventbus.pipeline": route.pipeline,
                    "eventbus.mode": "sync" if sync else "async",
                },
            )
            seen.extend((events, spans))
        if not sync:
            await ingress.publish(route, events)
            ids = [e.attributes["id"] for e in events]
            return 202, JSON_HEADERS, orjson.dumps({"accepted": len(ids), "ids": ids})
        outputs = split_outcomes(route.pipeline, events, await ingress.invoke(route, events))
        if not outputs:
            return 204, [], b""
        if len(outputs) == 1 and mode != "batch":
            hdrs, body_out = encode_http_binary(outputs[0])
        else:
            hdrs, body_out = encode_http_batch(outputs)
        return 200, list(hdrs), body_out

    async def starlette_reply(
        request: Request, kind: str, key: str, wait: bool | str | None = "query"
    ) -> Response:
        try:
            route = await ingress.route(kind, key)
            waits = _wait(request.scope) if wait == "query" else wait
            assert not isinstance(waits, str)
            reply = await handle(
                route,
                _headers(request.scope),
                lambda r: _read_body(request, r),
                waits,
                request.scope,
            )
        except IngressError as e:
            reply = error_reply(e)
        return to_response(reply)

    async def asgi_events(kind: str, key: str, scope: Any, receive: Any, send: Any) -> None:
        # The event routes, answered from the ASGI scope (see _GatewayApp).
        try:
            route = await ingress.route(kind, key)
            headers = _headers(scope)
            reply = await handle(
                route,
                headers,
                lambda r: _read_asgi_body(headers, receive, r),
                _wait(scope),
                scope,
            )
        except IngressError as e:
            reply = error_reply(e)
        except _Disconnected:
            return
        except Exception:
            log.exception("gateway: request %s %s failed", scope["method"], scope["path"])
            reply = (
                500,
                JSON_HEADERS,
                orjson.dumps(
                    {"error": "internal error in the gateway (logged); retry", "status": 500}
                ),
            )
        await _send_reply(send, reply)

    app.events_handler = asgi_events
    app.source_paths = lambda: ingress.routes.paths

    @app.get("/healthz", summary="Liveness", responses={200: {"description": "The gateway runs."}})
    async def healthz() -> Response:
        routes = ingress.routes
        return Response(
            orjson.dumps({"status": "ok", "pipelines": sorted(routes.pipelines)}),
            media_type="application/json",
        )

    if observer is not None:
        from eventbus.gateway._observer import add_observability_routes

        add_observability_routes(app, observer)

    @app.get("/v1/pipelines", summary="Pipelines this gateway serves")
    async def pipelines() -> Response:
        routes = ingress.routes
        out = [
            {
                "name": name,
                "http": name in routes.http,
                "grpc": name in routes.grpc,
                "paths": sorted(p for p, r in routes.paths.items() if r.pipeline == name),
            }
            for name in sorted(routes.pipelines)
        ]
        return Response(orjson.dumps(out), media_type="application/json")

    @app.post(
        "/v1/pipelines/{name}/events",
        summary="Send events to a pipeline",
        openapi_extra=_REQUEST_BODY,
        responses=_RESPONSES,
        status_code=202,
    )
    async def pipeline_events(name: str, request: Request, wait: bool | None = None) -> Response:
        return await starlette_reply(request, "http", name, wait)

    @app.post(
        "/{path:path}",
        summary="Send events to the pipeline serving this path (an http source's path:)",
        openapi_extra=_REQUEST_BODY,
        responses=_RESPONSES,
        status_code=202,
    )
    async def source_path(path: str, request: Request, wait: bool | None = None) -> Response:
        return await starlette_reply(request, "path", "/" + path, wait)

    # Plain Starlette routes ahead of FastAPI's for what reaches the app itself (an unknown
    # path, a pipeline deployed since the last refresh): no per-request parameter solving.
    async def fast_events(request: Request) -> Response:
        return await starlette_reply(request, "http", request.path_params["name"])

    async def fast_path(request: Request) -> Response:
        return await starlette_reply(request, "path", request.url.path)

    app.router.routes.insert(
        0, StarletteRoute("/v1/pipelines/{name}/events", fast_events, methods=["POST"])
    )
    app.router.routes.insert(1, StarletteRoute("/{path:path}", fast_path, methods=["POST"]))
    return app


def _headers_too_large(size: int) -> Reply:
    msg = (
        f"the request headers are {size} bytes (names and values); the gateway takes at most "
        f"{MAX_HEADER_BYTES}: send large values in the body"
    )
    return error_reply(IngressError(431, msg))


async def _send_reply(send: Any, reply: Reply) -> None:
    status, headers_out, body = reply
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers_out]
    if status != 204:
        raw.append((b"content-length", str(len(body)).encode()))
    if status in _CLOSE_AFTER:
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class _Disconnected(Exception):
    """The client went away before its body arrived: nothing to answer."""


def _headers(scope: Any) -> dict[str, str]:
    # One pass over the raw headers (names arrive lowercased), not Starlette's lazy
    # per-lookup decoding.
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def _read_asgi_body(headers: dict[str, str], receive: Any, route: Route) -> bytes:
    """The body from ASGI messages, held to the route's ``max_body_bytes`` (counted as it
    arrives, whatever content-length said) and to ``BODY_TIMEOUT_S`` (as _read_body)."""
    limit = route.config.max_body_bytes
    _check_declared_length(headers.get("content-length"), route)
    chunks = []
    size = 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Disconnected
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise IngressError(413, _over_limit(limit, route))
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except TimeoutError:
        raise _too_slow() from None


_TRUE = frozenset(("true", "1", "yes", "on"))
_FALSE = frozenset(("false", "0", "no", "off"))


def _wait(scope: Any) -> bool | None:
    query: bytes = scope.get("query_string", b"")
    if b"wait" not in query:
        return None
    raw = None
    for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if k == "wait":
            raw = v  # the last one, as Starlette's query_params.get
    if raw is None:
        return None
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise IngressError(
        400,
        f"query parameter wait is {raw!r}; use wait=true (answer with the outputs) or wait=false (202 once accepted)",
    )
