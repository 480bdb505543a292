"""Caller authentication: HMAC signatures of the canonical request with a replay window and a
replay cache, bearer tokens, 401 vs 403, who may ask for answers."""

from __future__ import annotations

import re

import pytest

from eventbus.errors import ConfigError, IngressError
from eventbus.eventing import _signature
from eventbus.eventing.sources import sign, sign_request
from eventbus.eventing.sources._http_config import AuthConfig
from eventbus.gateway._auth import (
    MemoryReplayCache,
    Replay,
    answer_sync,
    authenticate,
    index_tokens,
    load_credentials,
)
from eventbus.gateway._ingress import Ingress
from eventbus.gateway._routes import RouteTable
from tests.unit.gateway.conftest import MemoryBackend, pipeline_doc

BODY = b'{"amount": 5}'
NOW = 1_700_000_000
PATH = "/v1/pipelines/orders/events"
CE = {"content-type": "application/json", "ce-type": "payment.created", "ce-id": "e1"}


def hmac_creds(pipeline: str, secret: str, **kw: object):
    return load_credentials(
        pipeline,
        AuthConfig.model_validate({"hmac_sha256": {"secret_env": "S", **kw}}),
        {"S": secret},
    )


def bearer_creds(pipeline: str, token: str):
    return load_credentials(
        pipeline, AuthConfig.model_validate({"bearer": {"token_env": "T"}}), {"T": token}
    )


def status_of(cred, headers, body=BODY, owners=None, **request) -> int:
    request.setdefault("path", PATH)
    try:
        authenticate(cred, headers, body, owners, now=NOW, **request)
    except IngressError as e:
        return e.status
    return 200


def signed(secret: str = "s3cret", *, query: str = "", headers=None, t: int = NOW) -> dict:
    h = dict(CE if headers is None else headers)
    h["x-eventbus-signature"] = sign(secret, BODY, path=PATH, query=query, headers=h, timestamp=t)
    return h


def test_valid_signature_passes_and_tampering_fails() -> None:
    cred = hmac_creds("orders", "s3cret")
    h = signed()
    assert status_of(cred, h) == 200
    assert status_of(cred, h, body=b'{"amount": 6}') == 401
    assert status_of(cred, {}) == 401
    assert status_of(cred, {"x-eventbus-signature": "garbage"}) == 401


@pytest.mark.parametrize(
    ("change", "request_"),
    [
        ("another ce-type", ({"ce-type": "refund.created"}, {})),
        ("a ce-* header added", ({"ce-subject": "x"}, {})),
        ("a ce-* header dropped", ({"ce-id": None}, {})),
        ("another content-type", ({"content-type": "text/plain"}, {})),
        ("?wait=true added", ({}, {"query": "wait=true"})),
        ("another path", ({}, {"path": "/v1/pipelines/other/events"})),
        ("another method", ({}, {"method": "PUT"})),
    ],
)
def test_a_replay_with_other_headers_path_query_or_method_is_refused(change, request_) -> None:
    cred = hmac_creds("orders", "s3cret")
    h = signed()
    header_changes, other = request_
    for k, v in header_changes.items():
        if v is None:
            h.pop(k)
        else:
            h[k] = v
    with pytest.raises(IngressError, match="does not match the request") as info:
        authenticate(cred, h, BODY, now=NOW, **{"path": PATH, **other})
    assert info.value.status == 401, change


def test_query_order_and_header_name_case_do_not_matter() -> None:
    cred = hmac_creds("orders", "s3cret")
    value = sign_request(
        "s3cret",
        "post",
        f"http://gw{PATH}?b=2&wait=true",
        {"Content-Type": "application/json", "CE-Type": "t"},
        BODY,
        timestamp=NOW,
    )
    headers = {"content-type": "application/json", "ce-type": "t", "x-eventbus-signature": value}
    assert status_of(cred, headers, query="wait=true&b=2") == 200


def test_canonical_request_is_the_documented_form() -> None:
    got = _signature.canonical_request(
        timestamp=12,
        method="post",
        path="/hooks/a b",
        query="wait=true&a=1",
        headers={"ce-type": " t ", "content-type": "application/json", "ce-id": "1", "x": "y"},
        body=b"{}",
    )
    assert (
        got == b"12\nPOST\n/hooks/a%20b\na=1&wait=true\napplication/json\nce-id:1\nce-type:t\n\n{}"
    )


@pytest.mark.parametrize(
    "timestamp",
    ["\u00b2", "1\u00b2", "\u0661\u0662", "9" * 5000, "1" * 13, "-5", "", " 1"],
    ids=[
        "superscript",
        "digit+superscript",
        "arabic-indic",
        "5000 digits",
        "13 digits",
        "neg",
        "empty",
        "space",
    ],
)
def test_timestamp_must_be_ascii_digits_of_bounded_length(timestamp: str) -> None:
    cred = hmac_creds("orders", "s3cret")
    headers = {**CE, "x-eventbus-signature": f"t={timestamp},v2=" + "0" * 64}
    with pytest.raises(IngressError) as info:
        authenticate(cred, headers, BODY, now=NOW, path=PATH)
    assert info.value.status == 401
    assert "1 to 12 ASCII digits" in info.value.message or "must be 't=" in info.value.message
    assert len(info.value.message) < 300  # the value is not echoed back


def test_non_ascii_signature_is_401_not_a_crash() -> None:
    cred = hmac_creds("orders", "s3cret")
    headers = {**CE, "x-eventbus-signature": f"t={NOW},v2=\u00e9\u00e9"}
    assert status_of(cred, headers) == 401


def test_v1_body_only_signatures_are_refused_with_the_fix() -> None:
    cred = hmac_creds("orders", "s3cret")
    headers = {**CE, "x-eventbus-signature": f"t={NOW},v1=" + "0" * 64}
    with pytest.raises(IngressError, match="carries only v1 signatures") as info:
        authenticate(cred, headers, BODY, now=NOW, path=PATH)
    assert info.value.status == 401


def test_replay_window() -> None:
    cred = hmac_creds("orders", "s3cret", tolerance_s=60)
    with pytest.raises(IngressError, match="outside the 60 s replay window"):
        authenticate(cred, signed(t=NOW - 61), BODY, now=NOW, path=PATH)
    assert status_of(cred, signed(t=NOW - 59)) == 200


def test_a_valid_signature_gives_its_replay_entry_for_the_rest_of_the_window() -> None:
    cred = hmac_creds("orders", "s3cret", tolerance_s=60)
    h = signed(t=NOW - 20)
    replay = authenticate(cred, h, BODY, now=NOW, path=PATH)
    mac = h["x-eventbus-signature"].split("v2=")[1]
    assert replay == Replay(f"eventbus:replay:orders:{mac}", 41)


def test_signature_of_another_pipeline_is_401_and_no_other_secret_is_tried(monkeypatch) -> None:
    # 403 would need an HMAC per other pipeline per request: the signature cannot say which
    # secret made it. One HMAC, whatever the number of pipelines.
    docs = [
        pipeline_doc(f"p{i}", [{"http": {"auth": {"hmac_sha256": {"secret_env": f"S{i}"}}}}])
        for i in range(200)
    ]
    env = {f"S{i}": f"secret-{i}" for i in range(200)}
    ingress = Ingress(MemoryBackend(docs), RouteTable.from_documents(docs, env))
    calls = []
    real = _signature._mac
    monkeypatch.setattr(_signature, "_mac", lambda k, c: calls.append(k) or real(k, c))
    path = "/v1/pipelines/p0/events"
    headers = {**CE}
    headers["x-eventbus-signature"] = sign("secret-7", BODY, path=path, headers=headers)
    route = ingress.routes.http_route("p0")

    async def go() -> IngressError:
        with pytest.raises(IngressError) as info:
            await ingress.authenticate(route, headers, BODY, path=path)
        return info.value

    import asyncio

    calls.clear()
    err = asyncio.run(go())
    assert err.status == 401 and "does not match the request" in err.message
    assert len(calls) == 1


def test_bearer_tokens() -> None:
    mine, theirs = bearer_creds("orders", "tok-a"), bearer_creds("payments", "tok-b")
    owners = index_tokens([mine, theirs])
    assert status_of(mine, {"authorization": "Bearer tok-a"}, owners=owners) == 200
    assert status_of(mine, {"authorization": "Bearer tok-b"}, owners=owners) == 403
    assert status_of(mine, {"authorization": "Bearer nope"}, owners=owners) == 401
    assert status_of(mine, {"authorization": "Basic dG9rLWE="}) == 401
    assert status_of(mine, {}) == 401
    assert status_of(mine, {"authorization": "Bearer t\u00f6k"}, owners=owners) == 401


def test_bearer_403_is_one_dict_lookup_whatever_the_number_of_pipelines() -> None:
    mine = bearer_creds("orders", "tok-a")
    owners = index_tokens([mine, *(bearer_creds(f"p{i}", f"tok-{i}") for i in range(500))])

    class Counting(dict):
        lookups = 0

        def get(self, key, default=None):
            Counting.lookups += 1
            return super().get(key, default)

    counted = Counting(owners)
    assert status_of(mine, {"authorization": "Bearer tok-250"}, owners=counted) == 403
    assert Counting.lookups == 1


def test_a_token_shared_by_two_pipelines_still_opens_both() -> None:
    a, b = bearer_creds("a", "same"), bearer_creds("b", "same")
    owners = index_tokens([a, b])
    assert status_of(a, {"authorization": "Bearer same"}, owners=owners) == 200
    assert status_of(b, {"authorization": "Bearer same"}, owners=owners) == 200


def test_secrets_never_appear_in_messages_or_repr() -> None:
    cred = bearer_creds("orders", "very-secret-token")
    try:
        authenticate(cred, {"authorization": "Bearer wrong"}, BODY)
    except IngressError as e:
        assert "very-secret-token" not in str(e)
    assert "very-secret-token" not in repr(cred)


def test_missing_secret_names_the_variable_not_a_value(tmp_path) -> None:
    with pytest.raises(
        ConfigError, match=re.escape("auth secret environment variable PAY_SECRET is not set")
    ):
        load_credentials(
            "orders", AuthConfig.model_validate({"hmac_sha256": {"secret_env": "PAY_SECRET"}}), {}
        )
    f = tmp_path / "token"
    f.write_text("  from-file\n")
    cred = load_credentials(
        "orders", AuthConfig.model_validate({"bearer": {"token_file": str(f)}}), {}
    )
    assert status_of(cred, {"authorization": "Bearer from-file"}) == 200
    with pytest.raises(ConfigError, match="cannot be read"):
        load_credentials(
            "orders",
            AuthConfig.model_validate({"bearer": {"token_file": str(tmp_path / "nope")}}),
            {},
        )


def test_auth_config_needs_exactly_one_secret_place() -> None:
    with pytest.raises(ValueError, match="give exactly one secret:"):
        AuthConfig.model_validate({"hmac_sha256": {"secret_env": "A", "secret_file": "/f"}})
    with pytest.raises(ValueError, match="give exactly one token:"):
        AuthConfig.model_validate({"bearer": {"token": {"env": "A"}, "token_env": "A"}})
    with pytest.raises(ValueError, match="exactly one of secret: NAME, env: NAME or file: PATH"):
        AuthConfig.model_validate({"hmac_sha256": {"secret": {"env": "A", "secret": "B"}}})
    with pytest.raises(ValueError, match="exactly one of hmac_sha256, standard_webhooks or bearer"):
        AuthConfig.model_validate({})


async def test_memory_replay_cache_accepts_a_signature_once_per_window() -> None:
    now = [0.0]
    cache = MemoryReplayCache(clock=lambda: now[0])
    r = Replay("eventbus:replay:orders:ab", 10)
    assert await cache.claim(r) is True
    assert await cache.claim(r) is False
    now[0] = 11.0
    assert await cache.claim(r) is True  # out of the window: the timestamp check refuses it


async def test_redis_replay_cache_is_one_set_nx_with_the_window_as_expiry() -> None:
    from eventbus.gateway._auth import RedisReplayCache

    class FakeRedis:
        def __init__(self) -> None:
            self.calls: list[tuple] = []
            self.keys: set[str] = set()

        async def set(self, key, value, *, nx, ex):
            self.calls.append((key, value, nx, ex))
            if nx and key in self.keys:
                return None
            self.keys.add(key)
            return True

    redis = FakeRedis()
    cache = RedisReplayCache(redis)
    r = Replay("eventbus:replay:orders:ab", 42)
    assert await cache.claim(r) is True
    assert await cache.claim(r) is False
    assert redis.calls == [("eventbus:replay:orders:ab", "1", True, 42)] * 2


def test_answers_only_from_sync_sources() -> None:
    assert answer_sync("p", "http", "async", None) is False
    assert answer_sync("p", "http", "sync", None) is True
    assert answer_sync("p", "http", "sync", False) is False
    assert answer_sync("p", "http", "async", False) is False
    with pytest.raises(
        IngressError,
        match=re.escape("pipeline 'p' answers no ?wait=true: its http source is mode: async"),
    ) as info:
        answer_sync("p", "http", "async", True)
    assert info.value.status == 403 and "set mode: sync" in info.value.message
    with pytest.raises(IngressError, match="answers no Invoke: its grpc source is mode: async"):
        answer_sync("p", "grpc", "async", True)
