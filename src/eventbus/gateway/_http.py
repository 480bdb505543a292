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

import logging
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.routing import Route as StarletteRoute

from eventbus.errors import IngressError
from eventbus.eventing._http_codec import encode_http_batch, encode_http_binary
from eventbus.gateway._auth import answer_sync
from eventbus.gateway._http_io import (
    MAX_HEADER_BYTES,
    Disconnected,
    headers_too_large,
    read_asgi_body,
    read_body,
    scope_headers,
    send_reply,
    wait_of,
)
from eventbus.gateway._http_openapi import REQUEST_BODY, RESPONSES
from eventbus.gateway._ingress import Ingress, split_outcomes
from eventbus.gateway._replies import JSON_HEADERS, Reply, error_reply, to_response
from eventbus.gateway._routes import Route
from eventbus.observability._tracing import end_spans, start_event_spans, tracer

__all__ = ["MAX_HEADER_BYTES", "build_http_app"]

log = logging.getLogger("eventbus.gateway")


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
                await send_reply(send, headers_too_large(size))
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


class _EventReplies:
    """The answers of the event routes: a request read, authenticated, decoded, then published
    (async) or run through the pipeline (sync), counted and traced when ``figures`` or a
    tracer is set; from the ASGI scope (:meth:`asgi_events`) or a Starlette request
    (:meth:`starlette_reply`)."""

    def __init__(self, ingress: Ingress, figures: Any) -> None:
        self.ingress = ingress
        self.figures = figures

    async def handle(
        self,
        route: Route,
        headers: dict[str, str],
        read_body: Callable[[Route], Awaitable[bytes]],
        wait: bool | None,
        scope: Any,
    ) -> Reply:
        figures = self.figures
        if figures is None and tracer() is None:
            return await self._handle(route, headers, read_body, wait, None, scope)
        started = perf_counter()
        seen: list[Any] = []  # the decoded events and their spans
        status = 500
        error: BaseException | None = None
        try:
            reply = await self._handle(route, headers, read_body, wait, seen, scope)
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
        self,
        route: Route,
        headers: dict[str, str],
        read_body: Callable[[Route], Awaitable[bytes]],
        wait: bool | None,
        seen: list[Any] | None,
        scope: Any,
    ) -> Reply:
        ingress = self.ingress
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
        self, request: Request, kind: str, key: str, wait: bool | str | None = "query"
    ) -> Response:
        try:
            route = await self.ingress.route(kind, key)
            waits = wait_of(request.scope) if wait == "query" else wait
            assert not isinstance(waits, str)
            reply = await self.handle(
                route,
                scope_headers(request.scope),
                lambda r: read_body(request, r),
                waits,
                request.scope,
            )
        except IngressError as e:
            reply = error_reply(e)
        return to_response(reply)

    async def asgi_events(self, kind: str, key: str, scope: Any, receive: Any, send: Any) -> None:
        # The event routes, answered from the ASGI scope (see _GatewayApp).
        try:
            route = await self.ingress.route(kind, key)
            headers = scope_headers(scope)
            reply = await self.handle(
                route,
                headers,
                lambda r: read_asgi_body(headers, receive, r),
                wait_of(scope),
                scope,
            )
        except IngressError as e:
            reply = error_reply(e)
        except Disconnected:
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
        await send_reply(send, reply)


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
    replies = _EventReplies(ingress, observer.gateway if observer is not None else None)
    app.events_handler = replies.asgi_events
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

    _add_event_routes(app, replies)
    return app


def _add_event_routes(app: FastAPI, replies: _EventReplies) -> None:
    """The event routes as the app itself serves them (see :class:`_GatewayApp`)."""
    reply = replies.starlette_reply

    @app.post(
        "/v1/pipelines/{name}/events",
        summary="Send events to a pipeline",
        openapi_extra=REQUEST_BODY,
        responses=RESPONSES,
        status_code=202,
    )
    async def pipeline_events(name: str, request: Request, wait: bool | None = None) -> Response:
        return await reply(request, "http", name, wait)

    @app.post(
        "/{path:path}",
        summary="Send events to the pipeline serving this path (an http source's path:)",
        openapi_extra=REQUEST_BODY,
        responses=RESPONSES,
        status_code=202,
    )
    async def source_path(path: str, request: Request, wait: bool | None = None) -> Response:
        return await reply(request, "path", "/" + path, wait)

    # Plain Starlette routes ahead of FastAPI's for what reaches the app itself (an unknown
    # path, a pipeline deployed since the last refresh): no per-request parameter solving.
    async def fast_events(request: Request) -> Response:
        return await reply(request, "http", request.path_params["name"])

    async def fast_path(request: Request) -> Response:
        return await reply(request, "path", request.url.path)

    app.router.routes.insert(
        0, StarletteRoute("/v1/pipelines/{name}/events", fast_events, methods=["POST"])
    )
    app.router.routes.insert(1, StarletteRoute("/{path:path}", fast_path, methods=["POST"]))
