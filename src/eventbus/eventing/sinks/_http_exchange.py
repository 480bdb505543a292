"""The HTTP sink's exchange with a subscriber, apart from the sink's own loop: what one request
carries, what one answer says, ``Retry-After``, replies that cannot be used, and URLs made safe
to print."""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from eventbus.eventing._event import CloudEvent

__all__ = [
    "BODY_ATTRIBUTE_BYTES",
    "MAX_ANSWER_BYTES",
    "RETRYABLE",
    "Answer",
    "ReplyError",
    "Request",
    "parse_retry_after",
    "safe_url",
]

#: Bytes of an answer read at most (the rest is dropped with the connection).
MAX_ANSWER_BYTES = 64 * 1024
#: Bytes of a refusing answer's body kept in the dead letter's ``ebhttpbody``.
BODY_ATTRIBUTE_BYTES = 512
RETRYABLE = frozenset((408, 429))


def safe_url(url: str) -> str:
    """The URL without user info and query (which may carry secrets), for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclass(slots=True)
class Request:
    indexes: list[int]  # the items of the send call this request carries
    events: list[CloudEvent]
    encoded: tuple[list[tuple[str, str]], bytes] | None = None  # one event, encoded already
    item: Any = None  # the item of the send call (reply: true keys the reply by it)


class ReplyError(Exception):
    """A subscriber's 2xx answer claimed to be a CloudEvent reply but is not a valid one (or
    is larger than ``max_reply_bytes``): the event's input is dead-lettered with the reason."""

    def __init__(self, sink: str, detail: str) -> None:
        super().__init__(sink, detail)
        self.sink = sink
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.sink} answered with a reply that cannot be used: {self.detail}"


@dataclass(slots=True)
class Answer:
    status: int | None  # None: no answer (connection error, timeout)
    detail: str
    body: bytes = b""
    retry_after_s: float | None = None
    reply: CloudEvent | ReplyError | None = None


def parse_retry_after(value: str | None, cap_s: float, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` asks for (delta-seconds or an HTTP date), capped; None when
    absent or malformed (then the source's own backoff applies)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), cap_s)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    delta = when.timestamp() - (time.time() if now is None else now)
    return min(max(delta, 0.0), cap_s)
