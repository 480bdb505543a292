"""The gateway's transport-independent replies: ``(status, headers, body)``, JSON errors, and
their Starlette form."""

from __future__ import annotations

import math

import orjson
from fastapi.responses import Response

from eventbus.errors import IngressError

__all__ = ["JSON_HEADERS", "Reply", "error_reply", "to_response"]

Reply = tuple[int, list[tuple[str, str]], bytes]
JSON_HEADERS = [("content-type", "application/json")]


def error_reply(exc: IngressError) -> Reply:
    """The JSON error answer of an :class:`IngressError` (with ``Retry-After`` when it says)."""
    body = orjson.dumps({"error": exc.message, "status": exc.status})
    if exc.retry_after_s is not None:
        retry = [("retry-after", str(max(1, math.ceil(exc.retry_after_s))))]
        return exc.status, [*JSON_HEADERS, *retry], body
    return exc.status, JSON_HEADERS, body


def to_response(reply: Reply) -> Response:
    """A Starlette response of a reply."""
    status, headers, body = reply
    response = Response(body, status_code=status)
    for k, v in headers:
        response.headers[k] = v
    return response
