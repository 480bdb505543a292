"""Caller authentication: HMAC signatures with a replay window, bearer tokens, 401 vs 403."""

from __future__ import annotations

import re

import pytest

from eventbus.errors import ConfigError, IngressError
from eventbus.eventing.sources import sign
from eventbus.eventing.sources._http_config import AuthConfig
from eventbus.gateway._auth import authenticate, load_credentials

BODY = b'{"amount": 5}'
NOW = 1_700_000_000


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


def status_of(cred, headers, body=BODY, others=()) -> int:
    try:
        authenticate(cred, headers, body, others, now=NOW)
    except IngressError as e:
        return e.status
    return 200


def test_valid_signature_passes_and_tampering_fails() -> None:
    cred = hmac_creds("orders", "s3cret")
    sig = sign("s3cret", BODY, timestamp=NOW)
    assert status_of(cred, {"x-eventbus-signature": sig}) == 200
    assert status_of(cred, {"x-eventbus-signature": sig}, body=b'{"amount": 6}') == 401
    assert status_of(cred, {}) == 401
    assert status_of(cred, {"x-eventbus-signature": "garbage"}) == 401


def test_replay_window() -> None:
    cred = hmac_creds("orders", "s3cret", tolerance_s=60)
    old = sign("s3cret", BODY, timestamp=NOW - 61)
    with pytest.raises(IngressError, match="outside the 60 s replay window"):
        authenticate(cred, {"x-eventbus-signature": old}, BODY, (), now=NOW)
    assert (
        status_of(cred, {"x-eventbus-signature": sign("s3cret", BODY, timestamp=NOW - 59)}) == 200
    )


def test_signature_of_another_pipeline_is_403() -> None:
    mine, theirs = hmac_creds("orders", "a"), hmac_creds("payments", "b")
    sig = sign("b", BODY, timestamp=NOW)
    assert status_of(mine, {"x-eventbus-signature": sig}, others=[theirs]) == 403
    assert status_of(mine, {"x-eventbus-signature": sig}, others=[]) == 401


def test_bearer_tokens() -> None:
    mine, theirs = bearer_creds("orders", "tok-a"), bearer_creds("payments", "tok-b")
    assert status_of(mine, {"authorization": "Bearer tok-a"}) == 200
    assert status_of(mine, {"authorization": "Bearer tok-b"}, others=[theirs]) == 403
    assert status_of(mine, {"authorization": "Bearer nope"}, others=[theirs]) == 401
    assert status_of(mine, {"authorization": "Basic dG9rLWE="}) == 401
    assert status_of(mine, {}) == 401


def test_secrets_never_appear_in_messages_or_repr() -> None:
    cred = bearer_creds("orders", "very-secret-token")
    try:
        authenticate(cred, {"authorization": "Bearer wrong"}, BODY, ())
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
    with pytest.raises(ValueError, match="exactly one of secret_env"):
        AuthConfig.model_validate({"hmac_sha256": {"secret_env": "A", "secret_file": "/f"}})
    with pytest.raises(ValueError, match="exactly one of hmac_sha256 or bearer"):
        AuthConfig.model_validate({})
