"""The gateway's front door: a read token for what the gateway shows, and the Origin check of
state-changing requests. An ASGI wrapper around the whole HTTP app (event routes included).

Read token (optional; ``eventbus gateway --read-token-file F`` or ``EVENTBUS_READ_TOKEN``):
``GET /metrics``, ``/v1/stats``, ``/v1/history``, ``/v1/pipelines``,
``/v1/pipelines/{name}/stats``, ``/v1/pipelines/{name}/history`` and ``/dashboard`` show the pipelines' names, paths, topics and filters; with a read token set
they need ``Authorization: Bearer <token>`` (the admin token is accepted too). A browser opens
``/dashboard?token=<token>`` once: the gateway answers with a cookie (``HttpOnly``,
``SameSite=Strict``) and a redirect to ``/dashboard``, and the page's own requests carry the
cookie. Without a read token these routes stay open, as before.

Origin: a browser sends ``Origin`` with a cross-site POST, and a web page of any site may
POST to a gateway on the reader's network (an HTML form needs no CORS). A state-changing
request (POST, PUT, PATCH, DELETE: events and the admin API) whose ``Origin`` is neither the
gateway's own (``<scheme>://<Host>``) nor in the allow-list (``--allowed-origin``) gets a 403.
Clients other than browsers send no ``Origin`` and are not affected.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl

import orjson

__all__ = ["READ_COOKIE", "guard"]

#: The cookie the dashboard's requests carry the read token in.
READ_COOKIE = "eventbus_read"

_READ_PATHS = frozenset(("/metrics", "/v1/stats", "/v1/history", "/v1/pipelines", "/dashboard"))
_CHANGING = frozenset(("POST", "PUT", "PATCH", "DELETE"))


def _is_read_path(path: str) -> bool:
    if path in _READ_PATHS:
        return True
    return path.startswith("/v1/pipelines/") and path.endswith(("/stats", "/history"))


def _header(scope: Any, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


def _cookie(scope: Any, name: str) -> str | None:
    raw = _header(scope, b"cookie")
    if not raw:
        return None
    for part in raw.split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


async def _answer(
    send: Any, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _answer_json(send, status, {"error": message, "status": status}, extra)


async def _answer_json(
    send: Any, status: int, value: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = orjson.dumps(value)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def guard(app: Any, *, read_tokens: Iterable[str] = (), allowed_origins: Iterable[str] = ()) -> Any:
    """Wrap the gateway's ASGI app with the read-token and Origin checks.

    Args:
        app: the gateway's HTTP app.
        read_tokens: tokens that open the read routes (the read token, and the admin token);
            none: the read routes stay open.
        allowed_origins: origins (``https://shop.example``) whose web pages may POST besides
            the gateway's own.

    Returns:
        The wrapped ASGI app.

    Example:
        >>> wrapped = guard(object(), read_tokens=["r3ad"], allowed_origins=["https://a.example"])
    """
    tokens = [t.encode() for t in read_tokens if t]
    allowed = frozenset(o.rstrip("/").lower() for o in allowed_origins)

    def token_ok(given: str | None) -> bool:
        if not given:
            return False
        raw = given.encode("utf-8", "surrogateescape")
        ok = False
        for t in tokens:
            ok |= hmac.compare_digest(raw, t)
        return ok

    def reader(scope: Any) -> bool:
        """The request carries the read token (a bearer header, or the dashboard's cookie)."""
        scheme, _, given = (_header(scope, b"authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and token_ok(given.strip()):
            return True
        return token_ok(_cookie(scope, READ_COOKIE))

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        method: str = scope["method"]
        if method in _CHANGING:
            origin = _header(scope, b"origin")
            if origin is not None:
                own = f"{scope.get('scheme', 'http')}://{_header(scope, b'host') or ''}".lower()
                if origin.lower() != own and origin.rstrip("/").lower() not in allowed:
                    shown = origin if len(origin) <= 200 else origin[:200] + "..."
                    msg = (
                        f"requests from web pages of origin {shown!r} are refused (the gateway "
                        f"is {own}); start the gateway with --allowed-origin {shown} if that "
                        "page may send to it"
                    )
                    await _answer(send, 403, msg)
                    return
        elif tokens and scope["path"] == "/healthz" and not reader(scope):
            # liveness stays open, but which pipelines run is for readers only
            await _answer_json(send, 200, {"status": "ok"})
            return
        elif tokens and _is_read_path(scope["path"]):
            if reader(scope):
                await app(scope, receive, send)
                return
            if scope["path"] == "/dashboard":
                query = scope.get("query_string", b"").decode("latin-1")
                token = dict(parse_qsl(query)).get("token")
                if token_ok(token):
                    assert token is not None
                    cookie = f"{READ_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
                    extra = [(b"location", b"/dashboard"), (b"set-cookie", cookie.encode())]
                    await _answer(send, 303, "the read token is set as a cookie", extra)
                    return
            msg = (
                f"{scope['path']} needs the gateway's read token: send 'Authorization: Bearer "
                "<token>' (in a browser, open /dashboard?token=<token> once)"
            )
            realm = [(b"www-authenticate", b'Bearer realm="eventbus-read"')]
            await _answer(send, 401, msg, realm)
            return
        await app(scope, receive, send)

    return guarded
