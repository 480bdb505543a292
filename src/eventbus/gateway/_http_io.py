"""The gateway's HTTP plumbing under the event routes: the limits a request is held to as it
arrives (headers, body size and time), the body read from Starlette or straight from ASGI
messages, the ``wait`` query parameter, and a reply sent as ASGI messages."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request

from eventbus.errors import IngressError
from eventbus.gateway._replies import Reply, error_reply
from eventbus.gateway._routes import Route

__all__ = [
    "BODY_TIMEOUT_S",
    "MAX_HEADER_BYTES",
    "Disconnected",
    "headers_too_large",
    "read_asgi_body",
    "read_body",
    "scope_headers",
    "send_reply",
    "wait_of",
]

#: Most bytes of a request's header names and values together (431 above), on every route.
#: Each CloudEvent attribute is held to MAX_ATTRIBUTE_CHARS besides (400).
MAX_HEADER_BYTES = 16 * 1024
#: Longest a request's body may take to arrive, in seconds (408 after, and the connection is
#: closed): a client trickling its body holds a connection and a buffer, not the loop.
BODY_TIMEOUT_S = 30.0
# Answers sent before the body was read whole: the connection cannot serve another request.
_CLOSE_AFTER = frozenset((408, 413, 431))


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


async def read_body(request: Request, route: Route) -> bytes:
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


def headers_too_large(size: int) -> Reply:
    msg = (
        f"the request headers are {size} bytes (names and values); the gateway takes at most "
        f"{MAX_HEADER_BYTES}: send large values in the body"
    )
    return error_reply(IngressError(431, msg))


async def send_reply(send: Any, reply: Reply) -> None:
    status, headers_out, body = reply
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers_out]
    if status != 204:
        raw.append((b"content-length", str(len(body)).encode()))
    if status in _CLOSE_AFTER:
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class Disconnected(Exception):
    """The client went away before its body arrived: nothing to answer."""


def scope_headers(scope: Any) -> dict[str, str]:
    # One pass over the raw headers (names arrive lowercased), not Starlette's lazy
    # per-lookup decoding.
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def read_asgi_body(headers: dict[str, str], receive: Any, route: Route) -> bytes:
    """The body from ASGI messages, held to the route's ``max_body_bytes`` (counted as it
    arrives, whatever content-length said) and to ``BODY_TIMEOUT_S`` (as read_body)."""
    limit = route.config.max_body_bytes
    _check_declared_length(headers.get("content-length"), route)
    chunks = []
    size = 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise Disconnected
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


def wait_of(scope: Any) -> bool | None:
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
