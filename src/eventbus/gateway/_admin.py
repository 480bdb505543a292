"""The admin REST API on the gateway: what ``eventbus deploy/list/get/delete/versions/rollback/
status`` do, over HTTP, behind a bearer token.

Off unless a token is configured (``EVENTBUS_ADMIN_TOKEN`` or ``--admin-token-file``): an
admin API that anyone on the network could call would let them run code on the cluster.
Every call goes to the controller actor, as the CLI's do.

=========================================  ===========================================
``GET    /v1/admin/pipelines``             ``eventbus list``
``POST   /v1/admin/pipelines``             ``eventbus deploy`` (body: the YAML)
``GET    /v1/admin/pipelines/{name}``      the stored record (document, YAML, version)
``DELETE /v1/admin/pipelines/{name}``      ``eventbus delete``
``GET    /v1/admin/pipelines/{name}/versions``  ``eventbus versions``
``POST   /v1/admin/pipelines/{name}/rollback?to=N``  ``eventbus rollback``
``GET    /v1/admin/pipelines/{name}/status``    ``eventbus status NAME``
``POST   /v1/admin/pipelines/{name}/canary``    ``eventbus deploy --canary`` (body: YAML)
``GET    /v1/admin/pipelines/{name}/canary``    ``eventbus canary NAME``
``POST   /v1/admin/pipelines/{name}/promote``   ``eventbus promote NAME``
=========================================  ===========================================
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from eventbus.errors import ConfigError, DeployError, PipelineConfigError, PipelineNotFoundError

__all__ = [
    "MAX_YAML_BYTES",
    "add_admin_routes",
    "admin_token_from",
    "controller_handle",
    "read_token_from",
]

#: Largest pipeline YAML a deploy accepts.
MAX_YAML_BYTES = 1 << 20
_COOKIE_SAFE = re.compile(r"[A-Za-z0-9._~-]{1,512}")


def admin_token_from(environ: Mapping[str, str]) -> str | None:
    """The admin token: ``EVENTBUS_ADMIN_TOKEN``, else the file ``EVENTBUS_ADMIN_TOKEN_FILE``
    names (``eventbus up`` writes one to ``$EVENTBUS_HOME/admin_token``); None: API off.

    Raises:
        ConfigError: the file cannot be read or is empty.
    """
    token = environ.get("EVENTBUS_ADMIN_TOKEN")
    if token:
        return token.strip()
    path = environ.get("EVENTBUS_ADMIN_TOKEN_FILE")
    if not path:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        msg = f"admin token file {path!r} cannot be read ({e.strerror}); point --admin-token-file at a readable file"
        raise ConfigError(msg) from None
    if not token:
        msg = f"admin token file {path!r} is empty; write a long random token into it"
        raise ConfigError(msg)
    return token


def read_token_from(environ: Mapping[str, str]) -> str | None:
    """The read token (``/metrics``, ``/v1/stats``, ``/v1/pipelines``, ``/dashboard``):
    ``EVENTBUS_READ_TOKEN``, else the file ``EVENTBUS_READ_TOKEN_FILE`` names
    (``eventbus gateway --read-token-file``); None: those routes are open.

    Raises:
        ConfigError: the file cannot be read or is empty, or the token holds characters a
            cookie cannot carry.
    """
    token = environ.get("EVENTBUS_READ_TOKEN")
    path = environ.get("EVENTBUS_READ_TOKEN_FILE")
    if not token and path:
        try:
            token = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            msg = f"read token file {path!r} cannot be read ({e.strerror}); point --read-token-file at a readable file"
            raise ConfigError(msg) from None
        if not token.strip():
            msg = f"read token file {path!r} is empty; write a long random token into it"
            raise ConfigError(msg)
    if not token:
        return None
    token = token.strip()
    if not _COOKIE_SAFE.fullmatch(token):
        msg = (
            "the read token holds characters other than letters, digits and -._~ (the "
            "dashboard carries it in a cookie); use e.g. `openssl rand -hex 32`"
        )
        raise ConfigError(msg)
    return token


def controller_handle() -> Any:
    """The controller actor (looked up on each call: Ray restarts it under the same name)."""
    import ray

    from eventbus.serving._controller import CONTROLLER_NAME, NAMESPACE

    return ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)


def _problem(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def add_admin_routes(
    app: FastAPI, token: str | None, controller: Callable[[], Any] = controller_handle
) -> None:
    """Mount the admin API on ``app`` (ahead of the catch-all event routes).

    Args:
        app: the gateway's application.
        token: the bearer token callers must present; None turns the API off (404 with how
            to turn it on).
        controller: returns the controller actor handle.
    """
    router = APIRouter(prefix="/v1/admin", tags=["admin"])

    async def call(method: str, *args: Any, **kwargs: Any) -> Any:
        handle = controller()
        return await getattr(handle, method).remote(*args, **kwargs)

    guarded = [Depends(_authoriser(token))]
    _add_record_routes(router, call, guarded)
    _add_rollout_routes(router, call, guarded)
    before = list(app.router.routes)
    app.include_router(router)
    # The event routes end in a POST catch-all (``/{path:path}``): the admin routes go first.
    # By identity, not by path: FastAPI 0.165 includes a router as one entry without a path.
    mine = [r for r in app.router.routes if not any(r is b for b in before)]
    app.router.routes[:] = [*mine, *before]
    app.add_exception_handler(_Refused, _refused)  # type: ignore[arg-type]
    for exc_type, status_code in (
        (PipelineNotFoundError, 404),
        (PipelineConfigError, 422),
        (DeployError, 409),
    ):
        app.add_exception_handler(exc_type, _mapped(status_code))


def _authoriser(token: str | None) -> Callable[[Request], Awaitable[None]]:
    """The dependency every admin route has: the bearer token checked (404 when the API is off)."""

    async def authorise(request: Request) -> None:
        if token is None:
            raise _Refused(
                404,
                "the admin API is off; start the gateway with EVENTBUS_ADMIN_TOKEN set or --admin-token-file FILE",
            )
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise _Refused(
                401, "admin calls need 'Authorization: Bearer <token>' (the gateway's admin token)"
            )
        if not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise _Refused(401, "the admin token is not valid")

    return authorise


_Call = Callable[..., Awaitable[Any]]


def _add_record_routes(router: APIRouter, call: _Call, guarded: list[Any]) -> None:
    """List, deploy, get and delete pipelines."""

    @router.get("/pipelines", dependencies=guarded, summary="List the deployed pipelines")
    async def list_pipelines() -> Response:
        return JSONResponse(await call("list"))

    @router.post(
        "/pipelines",
        dependencies=guarded,
        status_code=201,
        summary="Deploy (or redeploy) a pipeline from its YAML",
    )
    async def deploy(request: Request, filename: str = "admin-api.yaml") -> Response:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_YAML_BYTES:
                return _problem(
                    413,
                    f"pipeline YAML over {MAX_YAML_BYTES} bytes; a pipeline document is a few KB, check the body",
                )
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            return _problem(
                400, f"the body is not UTF-8 text ({e}); send the pipeline YAML as it is"
            )
        info = await call("deploy", text, filename, [])
        return JSONResponse(info, status_code=201)

    @router.get("/pipelines/{name}", dependencies=guarded, summary="A pipeline's stored record")
    async def get(name: str) -> Response:
        rec = await call("get", name)
        return JSONResponse({k: v for k, v in rec.items() if k != "python_path"})

    @router.delete(
        "/pipelines/{name}",
        dependencies=guarded,
        status_code=204,
        summary="Drain and delete a pipeline",
    )
    async def delete(name: str) -> Response:
        await call("delete", name)
        return Response(status_code=204)


def _add_rollout_routes(router: APIRouter, call: _Call, guarded: list[Any]) -> None:
    """Versions, rollback, canaries and status."""

    @router.get(
        "/pipelines/{name}/versions", dependencies=guarded, summary="A pipeline's kept versions"
    )
    async def versions(name: str) -> Response:
        return JSONResponse(await call("versions", name))

    @router.post(
        "/pipelines/{name}/rollback",
        dependencies=guarded,
        summary="Deploy an earlier version again",
    )
    async def rollback(name: str, to: int | None = None) -> Response:
        return JSONResponse(await call("rollback", name, to))

    @router.post(
        "/pipelines/{name}/canary",
        dependencies=guarded,
        status_code=201,
        summary="Start a canary of new steps (body: the YAML)",
    )
    async def canary(
        name: str,
        request: Request,
        weights: str = "10,50,100",
        step_s: float = 30.0,
        filename: str = "admin-api.yaml",
    ) -> Response:
        try:
            ws = [int(w) for w in weights.split(",")]
        except ValueError:
            return _problem(
                400, f"weights {weights!r} are not integers; give percents like 10,50,100"
            )
        body = (await request.body())[: MAX_YAML_BYTES + 1]
        if len(body) > MAX_YAML_BYTES:
            return _problem(413, f"pipeline YAML over {MAX_YAML_BYTES} bytes")
        text = body.decode("utf-8", errors="replace")
        wrong = _other_pipeline(text, name)
        if wrong is not None:
            return wrong
        info = await call("deploy_canary", text, filename, [], weights=ws, step_s=step_s)
        return JSONResponse(info, status_code=201)

    @router.get("/pipelines/{name}/canary", dependencies=guarded, summary="A pipeline's canary")
    async def canary_state(name: str) -> Response:
        return JSONResponse(await call("canary_status", name))

    @router.post(
        "/pipelines/{name}/promote",
        dependencies=guarded,
        summary="Make the running canary the serving version",
    )
    async def promote(name: str) -> Response:
        return JSONResponse(await call("promote", name))

    @router.get(
        "/pipelines/{name}/status",
        dependencies=guarded,
        summary="A pipeline's version and live counters",
    )
    async def status(name: str) -> Response:
        return JSONResponse(await call("status", name))


def _other_pipeline(text: str, name: str) -> Response | None:
    """A 400 when the YAML posted to ``name``'s canary names another pipeline."""
    import yaml

    from eventbus.pipelines._yaml import load_yaml  # anchors/aliases refused (no bombs)

    try:
        named = ((load_yaml(text)[1] or {}).get("metadata") or {}).get("name")
    except (yaml.YAMLError, AttributeError):
        named = None  # the controller reports the YAML's problems
    if named is not None and named != name:
        return _problem(
            400,
            f"the YAML is of pipeline {named!r}, not {name!r}; post it to /v1/admin/pipelines/{named}/canary",
        )
    return None


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _refused(request: Request, exc: _Refused) -> Response:
    headers = {"WWW-Authenticate": 'Bearer realm="eventbus-admin"'} if exc.status == 401 else None
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)


def _mapped(status: int) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def handler(request: Request, exc: Exception) -> Response:
        orig = getattr(exc, "cause", None) or exc  # a Ray task error carries the controller's
        problems = getattr(orig, "problems", None)
        if problems:
            return JSONResponse(
                {
                    "error": f"{len(problems)} problems in the pipeline YAML",
                    "problems": [str(p) for p in problems],
                },
                status_code=status,
            )
        return JSONResponse({"error": str(orig)}, status_code=status)

    return handler
