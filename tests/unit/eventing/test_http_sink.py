"""The HTTP sink against a real uvicorn subscriber on loopback: content modes, auth (bearer,
HMAC checked with the gateway's own verifier), what each answer means (2xx, 408/429/5xx,
Retry-After, other 4xx, redirects), concurrency and rate limits, and hostile subscribers (a
hang, a 10 MB answer, a reset connection), each a bounded outcome."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.fixtures.http_receiver import Received, Reply

from eventbus import CloudEvent
from eventbus.eventing.sinks import HttpSink, HttpSinkConfig, SinkPartialError
from eventbus.eventing.sinks._http import parse_retry_after
from eventbus.eventing.sources._kafka_send import send_bounded
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy

pytestmark = pytest.mark.timeout(60)


def _events(n: int, **extra: Any) -> list[tuple[CloudEvent, bytes | None]]:
    return [
        (CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"i": i}, **extra), None)
        for i in range(n)
    ]


async def _sink(**config: Any) -> HttpSink:
    sink = HttpSink(HttpSinkConfig(**config))
    await sink.start()
    return sink


@pytest.fixture
async def closing() -> AsyncIterator[list[HttpSink]]:
    sinks: list[HttpSink] = []
    yield sinks
    for s in sinks:
        await s.stop()


@pytest.mark.parametrize("mode", ["binary", "structured", "batch"])
async def test_each_mode_delivers_every_event_once(receiver_factory, closing, mode) -> None:
    r = receiver_factory()
    sink = await _sink(url=r.url, mode=mode, max_batch=7, max_concurrency=1)
    closing.append(sink)
    await sink.send(_events(20))
    assert r.ids() == [f"e{i}" for i in range(20)]
    assert r.accepted[3].data == {"i": 3}
    assert len(r.requests) == (3 if mode == "batch" else 20)
    if mode == "binary":
        assert r.requests[0].headers["ce-id"] == "e0"


async def test_bearer_token_from_env(receiver_factory, closing, monkeypatch) -> None:
    monkeypatch.setenv("HOOK_TOKEN", "s3cret")
    r = receiver_factory()
    sink = await _sink(url=r.url, auth={"bearer": {"token": {"env": "HOOK_TOKEN"}}})
    closing.append(sink)
    await sink.send(_events(1))
    assert r.requests[0].headers["authorization"] == "Bearer s3cret"


async def test_hmac_signature_verified_by_the_gateway_check(
    receiver_factory, closing, tmp_path
) -> None:
    (tmp_path / "secret").write_text("k3y\n")
    r = receiver_factory(hmac_secret=b"k3y")
    hmac = {"secret": {"file": str(tmp_path / "secret")}}
    for mode in ("binary", "batch"):
        sink = await _sink(url=r.url + "?x=1", mode=mode, auth={"hmac_sha256": hmac})
        closing.append(sink)
        await sink.send(_events(3))
    assert [q.signature_ok for q in r.requests] == [True] * 4


async def test_a_missing_secret_names_the_reference(closing) -> None:
    from eventbus.errors import ConfigError

    sink = HttpSink(
        HttpSinkConfig(
            url="http://127.0.0.1:9/h", auth={"bearer": {"token": {"env": "NO_SUCH_VAR_X"}}}
        )
    )
    with pytest.raises(ConfigError, match="environment variable NO_SUCH_VAR_X is not set"):
        await sink.start()


async def test_answers_settle_each_event(receiver_factory, closing) -> None:
    def behaviour(req: Received, n: int) -> Reply:
        i = int(req.headers["ce-id"][1:])
        if i % 5 == 0:
            return Reply(400, body=b'{"error": "bad order"}')
        if i % 5 == 1:
            return Reply(503, headers=[("retry-after", "2")])
        if i % 5 == 2:
            return Reply(429, headers=[("retry-after", "soon")])
        return Reply(202)

    r = receiver_factory(behaviour)
    sink = await _sink(url=r.url)
    closing.append(sink)
    with pytest.raises(SinkPartialError) as info:
        await sink.send(_events(10))
    e = info.value
    assert sorted(e.refused) == [0, 5]
    assert e.refused[0] == (
        "HttpStatusError",
        f"http sink {r.url} answered 400 Bad Request",
    )
    assert e.attributes[5] == {"ebhttpstatus": 400, "ebhttpbody": '{"error": "bad order"}'}
    assert e.pending == [1, 2, 6, 7]
    assert sorted(r.ids()) == ["e3", "e4", "e8", "e9"]


def test_retry_after_parsing() -> None:
    assert parse_retry_after("3", 60) == 3
    assert parse_retry_after("3600", 60) == 60
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 60, now=1445412470) == 10
    assert parse_retry_after("soon", 60) is None
    assert parse_retry_after("-1", 60) is None
    assert parse_retry_after(None, 60) is None


async def test_delivery_retries_only_pending_events_honouring_retry_after(
    receiver_factory, closing
) -> None:
    """Through the source's bounded send: every event acknowledged exactly once, 400s
    refused with their status, the retry after a Retry-After: 1 no sooner than 1 s."""
    tries: dict[str, int] = {}

    def behaviour(req: Received, n: int) -> Reply:
        ce_id = req.headers["ce-id"]
        tries[ce_id] = tries.get(ce_id, 0) + 1
        if ce_id.endswith("7"):
            return Reply(422, body=b"x" * 2000)
        if tries[ce_id] == 1 and int(ce_id[1:]) % 3 == 0:
            return Reply(503, headers=[("retry-after", "1")])
        return Reply(200)

    r = receiver_factory(behaviour)
    sink = await _sink(url=r.url, max_concurrency=4)
    closing.append(sink)
    policy = DeliveryPolicy(retry_initial_s=0.01, retry_max_s=0.05, give_up_s=10)
    attributes: dict[int, dict[str, Any]] = {}
    start = time.monotonic()
    refused = await send_bounded(sink, _events(30), "sink", 1, policy, "p", attributes)
    assert time.monotonic() - start >= 0.95
    assert sorted(refused) == [7, 17, 27]
    assert attributes[7]["ebhttpstatus"] == 422 and len(attributes[7]["ebhttpbody"]) == 512
    assert sorted(r.ids()) == sorted(f"e{i}" for i in range(30) if i % 10 != 7)


async def test_per_key_order_and_max_concurrency(receiver_factory, closing) -> None:
    r = receiver_factory(lambda req, n: Reply(delay_s=0.02))
    sink = await _sink(url=r.url, max_concurrency=3)
    closing.append(sink)
    items = [
        (CloudEvent.create(type="t", source="/s", id=f"e{i}", data=None), b"k%d" % (i % 4))
        for i in range(40)
    ]
    await sink.send(items)
    assert r.max_in_flight == 3
    for k in range(4):
        mine = [i for i in r.ids() if int(i[1:]) % 4 == k]
        assert mine == [f"e{i}" for i in range(k, 40, 4)]


async def test_max_rate_spaces_the_events(receiver_factory, closing) -> None:
    r = receiver_factory()
    sink = await _sink(url=r.url, max_rate=100, max_concurrency=8)
    closing.append(sink)
    start = time.monotonic()
    await sink.send(_events(31))
    assert time.monotonic() - start >= 0.3
    assert len(r.ids()) == 31


async def test_a_hanging_subscriber_times_out(receiver_factory, closing) -> None:
    r = receiver_factory(lambda req, n: Reply(hang=True))
    sink = await _sink(url=r.url, timeout_s=0.3)
    closing.append(sink)
    start = time.monotonic()
    with pytest.raises(SinkPartialError) as info:
        await sink.send(_events(2))
    assert time.monotonic() - start < 10  # a hang, not slowness, is the bug
    assert info.value.pending == [0, 1]
    assert "no complete answer within timeout_s=0.3" in str(info.value)


async def test_a_10_mb_answer_is_read_no_further_than_64_kib(receiver_factory, closing) -> None:
    r = receiver_factory(lambda req, n: Reply(200 if n == 0 else 400, body_size=10 * 2**20))
    sink = await _sink(url=r.url, max_concurrency=1)
    closing.append(sink)
    start = time.monotonic()
    with pytest.raises(SinkPartialError) as info:
        await sink.send(_events(2))
    assert time.monotonic() - start < 10  # a hang, not slowness, is the bug
    assert sorted(info.value.refused) == [1] and info.value.pending == []
    assert info.value.attributes[1]["ebhttpbody"] == "x" * 512
    assert r.ids() == ["e0"]


async def test_a_redirect_is_refused_naming_the_fix(receiver_factory, closing) -> None:
    r = receiver_factory(lambda req, n: Reply(307, headers=[("location", "http://b/x?t=1")]))
    sink = await _sink(url=r.url)
    closing.append(sink)
    with pytest.raises(SinkPartialError) as info:
        await sink.send(_events(1))
    assert info.value.attributes[0]["ebhttpstatus"] == 307
    assert (
        "redirects are not followed; set url to the final location: http://b/x"
        in (info.value.refused[0][1])
    )


async def test_a_reset_connection_leaves_the_events_pending(closing) -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, not FIN

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        sink = await _sink(url=f"http://127.0.0.1:{port}/hook")
        closing.append(sink)
        with pytest.raises(SinkPartialError) as info:
            await sink.send(_events(1))
        assert info.value.pending == [0]
        assert "ReadError" in info.value.detail or "RemoteProtocolError" in info.value.detail
    finally:
        server.close()


async def test_a_batch_answered_413_is_sent_in_halves(receiver_factory, closing) -> None:
    r = receiver_factory(lambda req, n: Reply(413 if len(req.events) > 2 else 200))
    sink = await _sink(url=r.url, mode="batch", max_batch=8)
    closing.append(sink)
    await sink.send(_events(8))
    assert r.ids() == [f"e{i}" for i in range(8)]


@pytest.mark.redis
async def test_bearer_token_stored_on_the_stack_is_rotated_without_a_restart(
    receiver_factory, closing, monkeypatch, redis_url
) -> None:
    from cryptography.fernet import Fernet

    from eventbus._internal import keys
    from eventbus._internal.redis_client import connect
    from eventbus._internal.secret_store import KEY_ENV, SecretStore, configure
    from eventbus.eventing.sinks import _http

    key = Fernet.generate_key()
    monkeypatch.setenv(KEY_ENV, key.decode())
    monkeypatch.setattr(_http, "_ROTATE_S", 0.0)  # re-read at every batch (default 2 s)
    redis = connect(redis_url)
    store = SecretStore(redis, key)
    store.set("SINK_TOKEN", b"one")
    configure(redis_url, ttl_s=0.0)
    try:
        r = receiver_factory()
        sink = await _sink(url=r.url, auth={"bearer": {"token": {"secret": "SINK_TOKEN"}}})
        closing.append(sink)
        await sink.send(_events(1))
        store.set("SINK_TOKEN", b"two")
        await sink.send(_events(1))
        store.delete("SINK_TOKEN")  # gone: the sink keeps the one it has, and says why
        await sink.send(_events(1))
        assert [q.headers["authorization"] for q in r.requests] == [
            "Bearer one",
            "Bearer two",
            "Bearer two",
        ]
    finally:
        configure(None)
        redis.delete(keys.SECRETS, keys.SECRETS_VERSION)
        redis.close()
