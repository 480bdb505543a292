"""The gateway's HTTP/1.1 connection: uvicorn's httptools protocol with a bound on the head.

uvicorn's httptools protocol buffers a request's head whatever its size (a 20 MB header was
read whole before the application's own 16 KiB check ran) and waits for it forever (a client
sending one header byte a second holds a connection and its buffers open: slowloris). This
protocol counts the request line and header bytes as the parser hands them over and answers
431 past :data:`MAX_HEAD_BYTES`, and answers 408 when the head has not arrived
:data:`HEAD_TIMEOUT_S` after its first byte; either way the connection is closed and nothing
reaches the application. The body has its own bounds (``max_body_bytes``, the read timeout in
:mod:`eventbus.gateway._http`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HEAD_TIMEOUT_S", "MAX_HEAD_BYTES", "GatewayHttpProtocol"]

#: the request line and every header name and value of one request, in bytes
MAX_HEAD_BYTES = 16 * 1024 + 8 * 1024  # the app's 16 KiB of headers, plus a long URL
#: from the first byte of a request to the end of its head
HEAD_TIMEOUT_S = 10.0
#: how long a refused connection is read (and discarded) before it is closed
LINGER_S = 2.0

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing heads that are too large or too slow.

    Pass the class as ``uvicorn.Config(http=GatewayHttpProtocol)``; the limits are class
    attributes (a subclass or a test may lower them).
    """

    max_head_bytes: int = MAX_HEAD_BYTES
    head_timeout_s: float = HEAD_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # parsed: request line, header names and values
        self._head_raw = 0  # received while the head stayed open
        self._head_open = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:  # what follows a refused head is dropped with the connection
            return
        super().data_received(data)
        # httptools hands over a header only once its value is complete, and keeps the value
        # meanwhile: bytes that leave the head still open after parsing count against it too,
        # so one endless header value is refused at the bound, not buffered whole
        if self._head_open and not self._refused:
            self._head_raw += len(data)
            if self._head_raw > self.max_head_bytes:
                self._refuse(431, self._too_large())

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # the parser reports the exception _refuse raised as a malformed request: already answered
        if not self._refused:
            super().send_400_response(msg)

    # parser callbacks (httptools calls these from feed_data)
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = self._head_raw = 0
        self._head_open = True
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_too_slow)

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and CRLF, as on the wire
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.max_head_bytes:
            msg = self._too_large()
            self._refuse(431, msg)
            raise _HeadRefusedError(msg)  # stops the parser; send_400_response stays quiet

    def _too_large(self) -> str:
        return (
            f"the request line and headers are over {self.max_head_bytes} bytes; "
            "send large values in the body"
        )

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self._refused and not self.transport.is_closing():
            self._refuse(
                408, f"the request's headers did not arrive within {self.head_timeout_s:g} s"
            )

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, status: int, message: str) -> None:
        self._refused = True
        self._cancel_head_timer()
        body = b'{"error":"' + message.encode() + b'","status":' + str(status).encode() + b"}"
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body))
        )
        self.transport.write(head + body)
        # Close our side only (FIN after the answer) and read on for a moment, discarding:
        # closing at once with the client's unread bytes in the socket makes the kernel send
        # a reset, which can destroy the answer before the client reads it (nginx's
        # lingering close).
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


class _HeadRefusedError(Exception):
    """Raised from a parser callback to stop parsing a refused request (never escapes)."""
