"""Standard Webhooks as a signature scheme beside HMAC v2, with the `standardwebhooks` package
as the other side: it signs what the gateway verifies and verifies what the HTTP sink signs."""

from __future__ import annotations

import base64
import re
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from eventbus import CloudEvent
from eventbus.errors import ConfigError, IngressError
from eventbus.eventing import _standard_webhooks as swh
from eventbus.eventing.sinks import HttpSink, HttpSinkConfig
from eventbus.eventing.sources import GrpcSourceConfig
from eventbus.eventing.sources._http_config import AuthConfig
from eventbus.gateway._auth import Replay, authenticate, load_credentials
from eventbus.gateway._http import build_http_app
from eventbus.gateway._ingress import Ingress
from eventbus.gateway._routes import RouteTable
from tests.unit.gateway.conftest import MemoryBackend, pipeline_doc

SECRET = "whsec_" + base64.b64encode(b"a 32-byte key for the webhooks!!").decode()
OTHER = "whsec_" + base64.b64encode(b"another key, made by someone else").decode()
BODY = b'{"amount": 5}'
NOW = 1_700_000_000


def creds(secret: str = SECRET, **kw: Any):
    auth = AuthConfig.model_validate({"standard_webhooks": {"secret_env": "W", **kw}})
    return load_credentials("orders", auth, {"W": secret})


def library_signed(
    body: bytes = BODY, secret: str = SECRET, t: int = NOW, msg_id: str = "msg_1"
) -> dict[str, str]:
    """Headers as a sender using the `standardwebhooks` package makes them."""
    sig = Webhook(secret).sign(msg_id, datetime.fromtimestamp(t, UTC), body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(t), "webhook-signature": sig}


def status_of(cred, headers: dict[str, str], body: bytes = BODY, now: int = NOW) -> int | str:
    try:
        authenticate(cred, headers, body, now=now)
    except IngressError as e:
        return e.status
    return 200


def test_the_librarys_signature_passes_and_tampering_fails() -> None:
    cred = creds()
    h = library_signed()
    assert status_of(cred, h) == 200
    assert status_of(cred, h, body=b'{"amount": 6}') == 401
    assert status_of(cred, {**h, "webhook-id": "msg_2"}) == 401
    assert status_of(cred, library_signed(secret=OTHER)) == 401
    # an unprefixed secret is the same key
    assert status_of(creds(SECRET.removeprefix("whsec_")), h) == 200


def test_our_headers_pass_the_librarys_verify() -> None:
    key = swh.decode_secret(SECRET, "test")
    for body in (BODY, '{"name": "Zoë"}'.encode(), b"[]"):
        h = swh.webhook_headers(key, body, msg_id="msg_abc")
        assert Webhook(SECRET).verify(body, h, json_parse=False) is None
        with pytest.raises(WebhookVerificationError):
            Webhook(OTHER).verify(body, h, json_parse=False)


def test_secret_rotation_any_v1_signature_may_match() -> None:
    h = library_signed()
    other = library_signed(secret=OTHER)["webhook-signature"]
    rotated = {**h, "webhook-signature": f"{other} v1a,AAAA {h['webhook-signature']}"}
    assert status_of(creds(), rotated) == 200
    assert status_of(creds(OTHER), rotated) == 200


def test_replay_window_and_replay_entry() -> None:
    cred = creds(tolerance_s=60)
    with pytest.raises(IngressError, match="outside the 60 s replay window"):
        authenticate(cred, library_signed(t=NOW - 61), BODY, now=NOW)
    h = library_signed(t=NOW - 20)
    replay = authenticate(cred, h, BODY, now=NOW)
    sig = h["webhook-signature"].removeprefix("v1,")
    assert replay == Replay(f"eventbus:replay:orders:swh:{sig}", 41)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing header webhook-id, webhook-timestamp, webhook-signature; send webhook-id:"),
        ({"webhook-timestamp": None}, "missing header webhook-timestamp"),
        ({"webhook-timestamp": "9" * 5000}, "must be unix seconds in 1 to 12 ASCII digits"),
        ({"webhook-timestamp": "\u0661\u0662"}, "must be unix seconds in 1 to 12 ASCII digits"),
        ({"webhook-id": "x" * 100_000}, "webhook-id has 100000 characters; send at most 256"),
        ({"webhook-signature": "v1a,AAAA"}, "carries no 'v1,<base64>' signature (asymmetric v1a"),
        ({"webhook-signature": "garbage"}, "carries no 'v1,<base64>' signature"),
        ({"webhook-signature": " ".join(["v1,AAAA"] * 9)}, "carries more than 8 signatures"),
        ({"webhook-signature": "v1,Zoë\udcff"}, "does not match the request for pipeline"),
    ],
)
def test_hostile_headers_are_401_naming_the_fix(headers, message) -> None:
    h: dict[str, Any] = {**library_signed(), **headers} if headers else {}
    h = {k: v for k, v in h.items() if v is not None}
    with pytest.raises(IngressError, match=re.escape(message)) as info:
        authenticate(creds(), h, BODY, now=NOW)
    assert info.value.status == 401


def test_config_errors_name_the_secret_and_the_fix() -> None:
    with pytest.raises(
        ConfigError,
        match=re.escape("auth secret (env W) is not a Standard Webhooks secret: write 'whsec_'"),
    ):
        creds("not base64 at all!")
    with pytest.raises(ValueError, match="exactly one of hmac_sha256, standard_webhooks or bearer"):
        AuthConfig.model_validate(
            {"standard_webhooks": {"secret_env": "W"}, "hmac_sha256": {"secret_env": "H"}}
        )
    with pytest.raises(ValueError, match="grpc sources authenticate with bearer tokens only"):
        GrpcSourceConfig.model_validate({"auth": {"standard_webhooks": {"secret_env": "W"}}})


async def test_the_gateway_accepts_a_library_signed_request_once() -> None:
    docs = [pipeline_doc("hooks", [{"http": {"auth": {"standard_webhooks": {"secret_env": "W"}}}}])]
    backend = MemoryBackend(docs)
    ingress = Ingress(backend, RouteTable.from_documents(docs, {"W": SECRET}))
    transport = httpx.ASGITransport(app=build_http_app(ingress))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        h = library_signed(t=int(time.time()), msg_id="msg_9")
        h["content-type"] = "application/json"
        r = await c.post("/v1/pipelines/hooks/events", content=BODY, headers=h)
        assert r.status_code == 202, r.text
        r = await c.post("/v1/pipelines/hooks/events", content=BODY, headers=h)
        assert r.status_code == 401 and "was replayed" in r.json()["error"]
        r = await c.post("/v1/pipelines/hooks/events", content=b'{"amount": 7}', headers=h)
        assert r.status_code == 401 and "does not match" in r.json()["error"]
    assert [e.data for e in backend.published["hooks"]] == [{"amount": 5}]


def _events(n: int) -> list[tuple[CloudEvent, bytes | None]]:
    return [
        (CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"i": i}), None)
        for i in range(n)
    ]


async def test_the_http_sink_signs_what_the_library_verifies(receiver_factory, monkeypatch) -> None:
    monkeypatch.setenv("HOOK_WH_SECRET", SECRET)
    r = receiver_factory()
    auth = {"standard_webhooks": {"secret": {"env": "HOOK_WH_SECRET"}}}
    for mode in ("binary", "batch"):
        sink = HttpSink(HttpSinkConfig(url=r.url, mode=mode, auth=auth))
        await sink.start()
        try:
            await sink.send(_events(3))
            await sink.send(_events(3))  # the same events again, as a source's retry sends them
        finally:
            await sink.stop()
    assert len(r.requests) == 8
    for q in r.requests:
        Webhook(SECRET).verify(q.body, q.headers, json_parse=False)
        with pytest.raises(WebhookVerificationError):
            Webhook(OTHER).verify(q.body, q.headers, json_parse=False)
    ids = [q.headers["webhook-id"] for q in r.requests]
    # binary: one message per event (requests in flight together: in any order), the same id
    # when it is sent again; batch: one message
    assert set(ids[:3]) == set(ids[3:6]) and len(set(ids[:3])) == 3 and ids[6] == ids[7]
    pairs = {(q.headers["ce-id"], q.headers["webhook-id"]) for q in r.requests[:6]}
    assert len(pairs) == 3  # each event kept its webhook-id on the second send
    assert len(set(ids)) == 4 and all(i.startswith("msg_") for i in ids)


async def test_a_sink_secret_that_is_not_base64_is_a_config_error(monkeypatch) -> None:
    monkeypatch.setenv("HOOK_WH_SECRET", "whsec_***")
    sink = HttpSink(
        HttpSinkConfig(
            url="http://127.0.0.1:9/h",
            auth={"standard_webhooks": {"secret": {"env": "HOOK_WH_SECRET"}}},
        )
    )
    with pytest.raises(
        ConfigError, match="standard_webhooks secret is not a Standard Webhooks secret"
    ):
        await sink.start()
    assert "***" not in str(sink.target)
