"""The gateway's HTTP face: a FastAPI app over an :class:`Ingress`.

``POST /v1/pipelines/{name}/events`` and every ``path:`` an ``http`` source declares take
CloudEvents in the HTTP binding's binary, structured and batch modes, or plain JSON. Async
(default): 202 once the events are durably accepted. Sync (``?wait=true`` or the source's
``mode: sync``): the outputs, binary mode for one, batch mode for several, 204 for none.
Errors: a JSON body ``{"error": "...", "status": N}`` with 400, 401, 403, 404, 413, 422, 503
or 504.
"""

from __future__ import annotations

from pathlib import Path
from time import perf_counter
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.routing import Route as StarletteRoute

from eventbus.errors import IngressError
from eventbus.eventing._http_codec import encode_http_batch, encode_http_binary
from eventbus.eventing.sources._ingress import Ingress, Route, split_outcomes
from eventbus.observability._tracing import end_spans, start_event_spans, tracer

__all__ = ["build_http_app"]

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
            "application/cloudevents-batch+json": {"schema": {"type": "array", "items": _CE_SCHEMA}},
        },
    },
}
_ERROR = {"content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "string"}, "status": {"type": "integer"}}}}}}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Sync: the output events (binary mode for one, batch mode for several)."},
    202: {"description": "Async: accepted durably.", "content": {"application/json": {"schema": {"type": "object"}}}},
    204: {"description": "Sync: the events were filtered out."},
    400: {"description": "Malformed CloudEvent (the attribute is named).", **_ERROR},
    401: {"description": "No or bad credentials.", **_ERROR},
    403: {"description": "Credentials of another pipeline.", **_ERROR},
    404: {"description": "Unknown pipeline or path.", **_ERROR},
    413: {"description": "Body over the source's max_body_bytes.", **_ERROR},
    422: {"description": "Data fails the source's data_schema, or a step failed (sync).", **_ERROR},
    503: {"description": "The broker or the pipeline is unavailable; retry.", **_ERROR},
    504: {"description": "Sync: no answer within the source's timeout_ms.", **_ERROR},
}


def _error(exc: IngressError) -> Response:
    return Response(orjson.dumps({"error": exc.message, "status": exc.status}), status_code=exc.status, media_type="application/json")


async def _read_body(request: Request, route: Route) -> bytes:
    limit = route.config.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise IngressError(400, f"header content-length is {declared!r}; it must be a byte count")
        if int(declared) > limit:
            raise IngressError(413, f"the body is {int(declared)} bytes; pipeline {route.pipeline!r} takes at most {limit} (max_body_bytes of its http source): split it into smaller requests")
        return await request.body()
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise IngressError(413, f"the body is over {limit} bytes, the most pipeline {route.pipeline!r} takes (max_body_bytes of its http source): split it into smaller requests")
        chunks.append(chunk)
    return b"".join(chunks)


def build_http_app(ingress: Ingress, *, title: str = "EventBus gateway", observer: Any = None) -> FastAPI:
    """The gateway's FastAPI application.

    Args:
        ingress: request handling (routes and backend).
        title: the OpenAPI title.
        observer: an :class:`eventbus.observability._observer.Observer`: adds ``/metrics``,
            ``/v1/stats``, ``/v1/pipelines/{name}/stats`` and ``/dashboard``, and counts the
            requests (None: none of these).
    """
    app = FastAPI(title=title, version="1", docs_url="/docs", redoc_url=None)
    figures = observer.gateway if observer is not None else None

    async def handle(request: Request, route: Route, wait: bool | None) -> Response:
        if figures is None and tracer() is None:
            return await _handle(request, route, wait, None)
        started = perf_counter()
        seen: list[Any] = []  # the decoded events and their spans
        status = 500
        error: BaseException | None = None
        try:
            response = await _handle(request, route, wait, seen)
            status = response.status_code
            return response
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
                figures.observe(route.pipeline, "sync" if sync else "async", status, perf_counter() - started, n)

    async def _handle(request: Request, route: Route, wait: bool | None, seen: list[Any] | None) -> Response:
        body = await _read_body(request, route)
        # One pass over the raw headers (names arrive lowercased), not Starlette's lazy
        # per-lookup decoding.
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.scope["headers"]}
        ingress.authenticate(route, headers, body)
        events, mode = ingress.decode(route, headers, body)
        sync = route.config.mode == "sync" if wait is None else wait
        if seen is not None:
            spans = start_event_spans(
                f"eventbus.gateway {route.pipeline}", events, request_traceparent=headers.get("traceparent"),
                attributes={"eventbus.pipeline": route.pipeline, "eventbus.mode": "sync" if sync else "async"},
            )
            seen.extend((events, spans))
        if not sync:
            await ingress.publish(route, events)
            ids = [e.attributes["id"] for e in events]
            return Response(orjson.dumps({"accepted": len(ids), "ids": ids}), status_code=202, media_type="application/json")
        outputs = split_outcomes(route.pipeline, events, await ingress.invoke(route, events))
        if not outputs:
            return Response(status_code=204)
        if len(outputs) == 1 and mode != "batch":
            hdrs, body_out = encode_http_binary(outputs[0])
        else:
            hdrs, body_out = encode_http_batch(outputs)
        response = Response(body_out, status_code=200)
        for k, v in hdrs:
            response.headers[k] = v
        return response

    @app.get("/healthz", summary="Liveness", responses={200: {"description": "The gateway runs."}})
    async def healthz() -> Response:
        routes = ingress.routes
        return Response(orjson.dumps({"status": "ok", "pipelines": sorted(routes.pipelines)}), media_type="application/json")

    if observer is not None:
        _add_observability_routes(app, observer)

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
        try:
            return await handle(request, await ingress.route("http", name), wait)
        except IngressError as e:
            return _error(e)

    @app.post(
        "/{path:path}",
        summary="Send events to the pipeline serving this path (an http source's path:)",
        openapi_extra=_REQUEST_BODY,
        responses=_RESPONSES,
        status_code=202,
    )
    async def source_path(path: str, request: Request, wait: bool | None = None) -> Response:
        try:
            return await handle(request, await ingress.route("path", "/" + path), wait)
        except IngressError as e:
            return _error(e)

    # The hot paths as plain Starlette routes ahead of FastAPI's: the same handlers without
    # FastAPI's per-request parameter solving (a third of the gateway's CPU per request). The
    # FastAPI routes above stay for the OpenAPI document and answer identically.
    async def fast_events(request: Request) -> Response:
        try:
            route = await ingress.route("http", request.path_params["name"])
            return await handle(request, route, _wait(request))
        except IngressError as e:
            return _error(e)

    async def fast_path(request: Request) -> Response:
        try:
            route = await ingress.route("path", request.url.path)
            return await handle(request, route, _wait(request))
        except IngressError as e:
            return _error(e)

    app.router.routes.insert(0, StarletteRoute("/v1/pipelines/{name}/events", fast_events, methods=["POST"]))
    app.router.routes.insert(1, StarletteRoute("/{path:path}", fast_path, methods=["POST"]))
    return app


_DASHBOARD = Path(__file__).resolve().parents[2] / "observability" / "dashboard.html"


def _add_observability_routes(app: FastAPI, observer: Any) -> None:
    from eventbus.observability._prometheus import CONTENT_TYPE

    @app.get("/metrics", summary="Prometheus metrics of every pipeline and of this gateway")
    async def metrics() -> Response:
        return Response(await observer.metrics(), media_type=CONTENT_TYPE)

    @app.get("/v1/stats", summary="Every pipeline's topology and live figures")
    async def all_stats() -> Response:
        return Response(orjson.dumps(await observer.views()), media_type="application/json")

    @app.get("/v1/pipelines/{name}/stats", summary="A pipeline's topology and live figures")
    async def pipeline_stats(name: str) -> Response:
        view = await observer.view(name)
        if view is None:
            return _error(IngressError(404, f"no pipeline named {name!r} is deployed; GET /v1/stats lists them"))
        return Response(orjson.dumps(view), media_type="application/json")

    @app.get("/dashboard", summary="The web dashboard", include_in_schema=False)
    async def dashboard() -> Response:
        return Response(_DASHBOARD.read_bytes(), media_type="text/html; charset=utf-8")


_TRUE = frozenset(("true", "1", "yes", "on"))
_FALSE = frozenset(("false", "0", "no", "off"))


def _wait(request: Request) -> bool | None:
    raw = request.query_params.get("wait")
    if raw is None:
        return None
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise IngressError(400, f"query parameter wait is {raw!r}; use wait=true (answer with the outputs) or wait=false (202 once accepted)")
