"""The gateway's HTTP connection bounds the request head, on a real uvicorn server over loopback:
a huge header is a 431 before it is buffered whole, a trickled head a 408, and neither reaches
the application nor holds the event loop; ordinary and concurrent requests are untouched."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvicorn

from eventbus.gateway._protocol import GatewayHttpProtocol

pytestmark = pytest.mark.timeout(60)


class _QuickHead(GatewayHttpProtocol):
    head_timeout_s = 0.5


async def _app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    _app.calls += 1  # type: ignore[attr-defined]
    while (await receive()).get("more_body"):
        pass  # read the whole body, as the gateway does
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


_app.calls = 0  # type: ignore[attr-defined]


@pytest.fixture
async def port():
    config = uvicorn.Config(
        _app, host="127.0.0.1", port=0, http=_QuickHead, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and not task.done()
        await asyncio.sleep(0.01)
    _app.calls = 0  # type: ignore[attr-defined]
    yield server.servers[0].sockets[0].getsockname()[1]
    server.should_exit = True
    await task


async def _exchange(port: int, chunks: list[bytes], pause_s: float = 0.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for chunk in chunks:
            writer.write(chunk)
            try:
                await writer.drain()
            except ConnectionError:
                break  # the server closed on us: read what it answered
            if pause_s:
                await asyncio.sleep(pause_s)  # a slow client, on purpose
        return await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()


async def test_an_ordinary_request_passes(port: int) -> None:
    answer = await _exchange(port, [b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"])
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")


async def test_a_20_mb_header_is_431_without_reaching_the_app(port: int) -> None:
    head = b"POST / HTTP/1.1\r\nhost: x\r\nx-big: "
    chunks = [head] + [b"a" * 65536] * 320 + [b"\r\n\r\n"]  # 20 MiB, sent as it streams
    start = time.perf_counter()
    answer = await _exchange(port, chunks)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b"over 24576 bytes" in answer
    assert time.perf_counter() - start < 2
    assert _app.calls == 0  # type: ignore[attr-defined]


async def test_many_small_headers_count_too(port: int) -> None:
    headers = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 50) for i in range(1000))
    answer = await _exchange(port, [b"GET / HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n"])
    assert answer.startswith(b"HTTP/1.1 431")


async def test_a_trickled_head_is_408_and_the_loop_keeps_serving(port: int) -> None:
    slow = asyncio.create_task(
        _exchange(port, [b"GET / HTTP/1.1\r\n", *[b"x-a: b\r\n"] * 40], pause_s=0.05)
    )
    # while the slow client trickles, others are answered at once
    for _ in range(5):
        ok = await _exchange(port, [b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"])
        assert ok.startswith(b"HTTP/1.1 200")
    answer = await slow
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"within 0.5 s" in answer
    assert _app.calls == 5  # type: ignore[attr-defined]


async def test_keep_alive_requests_each_get_a_fresh_budget(port: int) -> None:
    one = b"GET / HTTP/1.1\r\nhost: x\r\nx-h: " + b"v" * 20_000 + b"\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(3):  # 60 KB over one connection: under the bound per request
            writer.write(one)
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), timeout=5)
            assert status.startswith(b"HTTP/1.1 200"), status
            await asyncio.wait_for(reader.readuntil(b"ok"), timeout=5)
    finally:
        writer.close()


async def test_a_large_body_after_a_small_head_passes(port: int) -> None:
    body = b"b" * 1_000_000
    head = b"POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: %d\r\n" % len(body)
    answer = await _exchange(port, [head, b"\r\n" + body[:30_000], body[30_000:]])
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_uvicorn_is_the_pinned_version_with_the_hooks_the_protocol_overrides() -> None:
    """``gateway/_protocol.py`` subclasses uvicorn's httptools protocol (uvicorn's adapter): an
    upgrade that renames a parser callback would leave the head bounds silently off."""
    import inspect
    from importlib.metadata import version

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert version("uvicorn") == "0.54.0", (
        "uvicorn was upgraded: check gateway/_protocol.py's overrides against the new "
        "HttpToolsProtocol, then update this pin and pyproject's"
    )
    for hook in (
        "data_received",
        "connection_lost",
        "send_400_response",
        "on_message_begin",
        "on_url",
        "on_header",
        "on_headers_complete",
    ):
        assert callable(getattr(HttpToolsProtocol, hook, None)), hook
    source = inspect.getsource(HttpToolsProtocol)
    assert "self.loop =" in source and "self.transport =" in source
