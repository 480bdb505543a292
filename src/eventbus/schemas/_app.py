"""The registry's HTTP API: the Confluent Schema Registry REST subset its clients use.

Served standalone (:func:`kafka_registry_app`, any ASGI server) or by the gateway under
``/registry`` (``eventbus up``: ``http://127.0.0.1:8080/registry``). Answers and errors have
Confluent's shapes (``{"id": 1}``, ``{"error_code": 40401, "message": "..."}``), so
confluent-kafka's ``SchemaRegistryClient`` and serializers work against it unchanged.
"""

from __future__ import annotations

import contextlib
import hmac
import json
from base64 import b64decode
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from eventbus.eventing import KafkaClientConfig
from eventbus.schemas._errors import SchemaRegistryError
from eventbus.schemas._log import SCHEMAS_TOPIC, KafkaSchemaLog
from eventbus.schemas._registry import SchemaRegistry
from eventbus.schemas._state import Entry

__all__ = ["MAX_SCHEMA_BYTES", "build_registry_app", "kafka_registry_app"]

#: The largest request body (a schema and its envelope): one ``_schemas`` record must fit the
#: broker's default ``message.max.bytes`` (1 MB).
MAX_SCHEMA_BYTES = 900_000
_MEDIA = "application/vnd.schemaregistry.v1+json"
_Handler = Callable[[Request], Awaitable[Any]]


class _Json(JSONResponse):
    media_type = _MEDIA


def _error(e: SchemaRegistryError) -> Response:
    return _Json(e.body(), status_code=e.status)


async def _body(request: Request) -> Any:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_SCHEMA_BYTES:
        raise _too_large(int(declared))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_SCHEMA_BYTES:
            raise _too_large(size)
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks) or b"null")
    except (ValueError, RecursionError) as e:
        raise SchemaRegistryError(400, 400, f"the request body is not valid JSON: {e}") from e


def _too_large(size: int) -> SchemaRegistryError:
    msg = (
        f"the request body is {size} bytes or more; a schema may take at most "
        f"{MAX_SCHEMA_BYTES} bytes (one record of the {SCHEMAS_TOPIC} topic)"
    )
    return SchemaRegistryError(413, 413, msg)


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "false").lower() == "true"


def _registered(e: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {
        "subject": e.subject,
        "version": e.version,
        "id": e.id,
        "schema": e.schema,
    }
    if e.schema_type != "AVRO":
        out["schemaType"] = e.schema_type
    if e.references:
        out["references"] = [{"name": n, "subject": s, "version": v} for n, s, v in e.references]
    return out


def _schema_id(request: Request) -> int:
    raw = request.path_params["id"]
    if not raw.isdigit():
        raise SchemaRegistryError(404, 40403, f"Schema {raw} not found.")
    return int(raw)


def build_registry_app(
    registry: SchemaRegistry,
    *,
    write_token: str | None = None,
    lifespan: Callable[[Any], contextlib.AbstractAsyncContextManager[None]] | None = None,
) -> Starlette:
    """The REST API over ``registry`` as an ASGI app.

    Args:
        registry: the operations and their state.
        write_token: when set, requests that change the registry (register, config,
            delete) need it, as ``Authorization: Bearer <token>`` or as the password of
            basic auth (confluent-kafka's ``basic.auth.user.info``).
        lifespan: started and stopped with the app (standalone serving).

    Example:
        >>> from eventbus.schemas import MemorySchemaLog, SchemaRegistry
        >>> app = build_registry_app(SchemaRegistry(MemorySchemaLog()))
    """
    reg = registry
    token = write_token.encode() if write_token else None

    def allowed(request: Request) -> bool:
        if token is None:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "basic":
            try:
                given = b64decode(given).decode().partition(":")[2]
            except ValueError:
                return False
        return hmac.compare_digest(given.encode(), token)

    def endpoint(fn: _Handler, *, writes: bool = False) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                if writes and not allowed(request):
                    msg = "this registry takes changes with its write token only (the gateway's admin token)"
                    raise SchemaRegistryError(401, 40101, msg)
                result = await fn(request)
            except SchemaRegistryError as e:
                return _error(e)
            return result if isinstance(result, Response) else _Json(result)

        return run

    async def root(request: Request) -> Any:
        return {}

    async def types(request: Request) -> Any:
        return ["AVRO"]

    async def subjects(request: Request) -> Any:
        return reg.state.subjects(deleted=_flag(request, "deleted"))

    async def versions(request: Request) -> Any:
        subject = request.path_params["subject"]
        reg.entry(subject, "latest", deleted=True)  # 40401 when unknown
        vs = reg.state.versions.get(subject, {})
        shown = [v for v in sorted(vs) if _flag(request, "deleted") or not vs[v].deleted]
        if not shown:
            raise SchemaRegistryError(404, 40401, f"Subject '{subject}' not found.")
        return shown

    async def register(request: Request) -> Any:
        return await reg.register(request.path_params["subject"], await _body(request))

    async def version(request: Request) -> Any:
        p = request.path_params
        return _registered(reg.entry(p["subject"], p["version"], _flag(request, "deleted")))

    async def version_schema(request: Request) -> Any:
        p = request.path_params
        return PlainTextResponse(reg.entry(p["subject"], p["version"]).schema, media_type=_MEDIA)

    async def lookup(request: Request) -> Any:
        subject = request.path_params["subject"]
        return _registered(reg.lookup(subject, await _body(request), _flag(request, "deleted")))

    async def delete_version(request: Request) -> Any:
        p = request.path_params
        return await reg.delete_version(p["subject"], p["version"], _flag(request, "permanent"))

    async def delete_subject(request: Request) -> Any:
        subject = request.path_params["subject"]
        return await reg.delete_subject(subject, _flag(request, "permanent"))

    async def by_id(request: Request) -> Any:
        schema_id = _schema_id(request)
        if schema_id not in reg.state.by_id:
            # registered through another server a moment ago (a producer's first record
            # can arrive before this server read its registration): read the topic's end first
            await reg.log.catch_up()
        e = reg.by_id(schema_id)
        out = _registered(e)
        return {k: out[k] for k in ("schema", "schemaType", "references") if k in out}

    async def id_versions(request: Request) -> Any:
        return reg.versions_of_id(_schema_id(request))

    async def id_subjects(request: Request) -> Any:
        return sorted({v["subject"] for v in reg.versions_of_id(_schema_id(request))})

    async def compatibility(request: Request) -> Any:
        p = request.path_params
        problems = reg.check(p["subject"], await _body(request), p.get("version"))
        out: dict[str, Any] = {"is_compatible": not problems}
        if _flag(request, "verbose"):
            out["messages"] = problems
        return out

    async def get_config(request: Request) -> Any:
        subject = request.path_params.get("subject")
        if subject is None or _flag(request, "defaultToGlobal"):
            return {"compatibilityLevel": reg.state.level(subject)}
        return {"compatibilityLevel": reg.subject_level(subject)}

    async def put_config(request: Request) -> Any:
        level = await reg.set_level(request.path_params.get("subject"), await _body(request))
        return {"compatibility": level}

    async def delete_config(request: Request) -> Any:
        return {"compatibilityLevel": await reg.clear_level(request.path_params["subject"])}

    s = "/subjects/{subject:path}"
    routes = [
        Route("/", endpoint(root)),
        Route("/schemas/types", endpoint(types)),
        Route("/subjects", endpoint(subjects)),
        Route(s + "/versions", endpoint(versions), methods=["GET"]),
        Route(s + "/versions", endpoint(register, writes=True), methods=["POST"]),
        Route(s + "/versions/{version}/schema", endpoint(version_schema), methods=["GET"]),
        Route(s + "/versions/{version}", endpoint(version), methods=["GET"]),
        Route(s + "/versions/{version}", endpoint(delete_version, writes=True), methods=["DELETE"]),
        Route(s, endpoint(lookup), methods=["POST"]),
        Route(s, endpoint(delete_subject, writes=True), methods=["DELETE"]),
        Route("/schemas/ids/{id}", endpoint(by_id)),
        Route("/schemas/ids/{id}/versions", endpoint(id_versions)),
        Route("/schemas/ids/{id}/subjects", endpoint(id_subjects)),
        Route(
            "/compatibility" + s + "/versions/{version}", endpoint(compatibility), methods=["POST"]
        ),
        Route("/compatibility" + s + "/versions", endpoint(compatibility), methods=["POST"]),
        Route("/config", endpoint(get_config), methods=["GET"]),
        Route("/config", endpoint(put_config, writes=True), methods=["PUT"]),
        Route("/config/{subject:path}", endpoint(get_config), methods=["GET"]),
        Route("/config/{subject:path}", endpoint(put_config, writes=True), methods=["PUT"]),
        Route("/config/{subject:path}", endpoint(delete_config, writes=True), methods=["DELETE"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)

    async def not_found(request: Request, exc: Exception) -> Response:
        msg = f"HTTP 404 Not Found: {request.method} {request.url.path} is not a registry route"
        return _Json({"error_code": 404, "message": msg}, status_code=404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        msg = f"HTTP 405 Method Not Allowed: {request.method} {request.url.path}"
        return _Json({"error_code": 405, "message": msg}, status_code=405)

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_allowed)
    return app


def kafka_registry_app(
    bootstrap: str,
    *,
    topic: str = SCHEMAS_TOPIC,
    client: KafkaClientConfig | None = None,
    write_token: str | None = None,
) -> Starlette:
    """A standalone registry over the ``_schemas`` topic of ``bootstrap`` (replayed at
    startup, so run it with lifespan on: ``uvicorn.run(kafka_registry_app(...))``).

    Example:
        >>> app = kafka_registry_app("127.0.0.1:9092")
    """
    log = KafkaSchemaLog(bootstrap, topic=topic, client=client)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        try:
            await log.start()
            yield
        finally:
            await log.close()

    return build_registry_app(SchemaRegistry(log), write_token=write_token, lifespan=lifespan)
