"""Secrets stored on the stack (``_internal.secret_store``) on a real Redis: encrypted at rest,
rotated, listed without values, deleted; hostile names and values; concurrent set/rotate;
the gateway's and ``deploy``'s use of them (routes resolved from the stored values, references
that cannot resolve refused, the old ``secret_env`` spelling noticed)."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from eventbus._internal import keys
from eventbus._internal.redis_client import connect
from eventbus._internal.secret_store import (
    KEY_ENV,
    MAX_VALUE_BYTES,
    SecretStore,
    configure,
    env_digests,
    load_key,
    lookup,
)
from eventbus.errors import ConfigError
from eventbus.eventing._kafka_client import SecretRef
from eventbus.gateway._routes import RouteTable
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._secret_check import deprecated_spellings, secret_reference_problems

pytestmark = pytest.mark.redis


@pytest.fixture
def redis(redis_url: str) -> Any:
    client = connect(redis_url, decode_responses=True)
    client.delete(keys.SECRETS, keys.SECRETS_VERSION, keys.GATEWAY_ENV)
    yield client
    client.delete(keys.SECRETS, keys.SECRETS_VERSION, keys.GATEWAY_ENV)
    client.close()


@pytest.fixture
def key() -> bytes:
    return Fernet.generate_key()


def test_set_get_rotate_list_delete_and_encrypted_at_rest(redis: Any, key: bytes) -> None:
    store = SecretStore(redis, key)
    assert store.set("PAYMENTS_HMAC", b"s3cret-value") is False
    assert store.set("PAYMENTS_HMAC", b"rotated-value") is True  # a rotation
    assert store.get("PAYMENTS_HMAC") == b"rotated-value"
    assert store.get("NOPE") is None
    raw = redis.hget(keys.SECRETS, "PAYMENTS_HMAC")
    assert "rotated-value" not in raw and "s3cret" not in raw  # ciphertext only
    listed = store.list()
    assert [r["name"] for r in listed] == ["PAYMENTS_HMAC"]
    assert "value" not in json.dumps(listed) and "rotated" not in json.dumps(listed)
    assert store.version() == 2
    assert SecretStore(redis).delete("PAYMENTS_HMAC") is True  # no key needed to delete
    assert SecretStore(redis).delete("PAYMENTS_HMAC") is False
    assert store.version() == 4 and store.list() == []


def test_another_stacks_key_does_not_decrypt_and_says_so(redis: Any, key: bytes) -> None:
    SecretStore(redis, key).set("A", b"x")
    with pytest.raises(ConfigError, match=r"secret 'A' does not decrypt .* set it again"):
        SecretStore(redis, Fernet.generate_key()).get("A")


@pytest.mark.parametrize(
    "name",
    ["", "1abc", "a b", "a:b", "a/b", "é", "a\x00b", "x" * 129, "-a", "a\nb"],
)
def test_bad_names_are_refused_naming_the_rule(redis: Any, key: bytes, name: str) -> None:
    with pytest.raises(ConfigError, match="is not valid: use 1-128 letters"):
        SecretStore(redis, key).set(name, b"v")
    assert redis.hlen(keys.SECRETS) == 0


def test_empty_and_huge_values_are_refused_the_largest_kept(redis: Any, key: bytes) -> None:
    store = SecretStore(redis, key)
    with pytest.raises(ConfigError, match="the value is empty"):
        store.set("A", b"")
    with pytest.raises(ConfigError, match=f"more than {MAX_VALUE_BYTES}"):
        store.set("A", b"x" * (MAX_VALUE_BYTES + 1))
    big = os.urandom(MAX_VALUE_BYTES)  # any bytes, the largest size
    store.set("A", big)
    assert store.get("A") == big


def test_concurrent_set_and_rotate_never_tear_a_value(redis_url: str, redis: Any) -> None:
    key = Fernet.generate_key()
    values = {f"v{t}-{i}".encode() * 50 for t in range(8) for i in range(25)}
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        store = SecretStore(connect(redis_url), key)
        try:
            for i in range(25):
                store.set("ROTATED", f"v{t}-{i}".encode() * 50)
                assert store.get("ROTATED") in values
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    store = SecretStore(redis, key)
    assert store.get("ROTATED") in values
    assert store.version() == 8 * 25  # every change counted once


def test_key_from_env_or_created_file(tmp_path: Path) -> None:
    k = Fernet.generate_key().decode()
    assert load_key({KEY_ENV: k}) == k.encode()
    with pytest.raises(ConfigError, match="is not a Fernet key"):
        load_key({KEY_ENV: "short"})
    home = {"EVENTBUS_HOME": str(tmp_path / "home")}
    with pytest.raises(ConfigError, match="no secret key here"):
        load_key(home)
    made = load_key(home, create=True)
    path = tmp_path / "home" / "secret.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key(home) == made and load_key(home, create=True) == made  # kept


def test_a_replica_resolves_and_sees_a_rotation(
    redis_url: str, redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = Fernet.generate_key()
    monkeypatch.setenv(KEY_ENV, key.decode())
    configure(redis_url, ttl_s=0.0)
    try:
        ref = SecretRef(secret="SINK_TOKEN")
        with pytest.raises(ConfigError, match="'SINK_TOKEN' is not set on the stack"):
            ref.resolve("sink.http.auth.token")
        SecretStore(redis, key).set("SINK_TOKEN", b"one")
        assert ref.resolve("sink") == "one"
        SecretStore(redis, key).set("SINK_TOKEN", b"two")
        assert lookup("SINK_TOKEN") == b"two"
    finally:
        configure(None)
    with pytest.raises(ConfigError, match="not connected to a stack's secrets"):
        lookup("SINK_TOKEN")


def doc(auth: dict[str, Any], name: str = "hooked") -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"http": {"path": f"/{name}", "auth": auth}}],
            "sink": {"kafka": {"topic": "out"}},
        },
    }


def test_gateway_routes_resolve_stored_secrets() -> None:
    docs = [
        doc({"hmac_sha256": {"secret": {"secret": "HOOK"}}}),
        doc({"bearer": {"token": {"secret": "GONE"}}}, "other"),
    ]
    table = RouteTable.from_documents(docs, {}, {"HOOK": b"k1"})
    route = table.http_route("hooked")
    assert route.credentials is not None and route.credentials.secret == b"k1"
    other = table.http_route("other")
    assert other.credentials is None and "auth secret 'GONE' is not set on the stack" in str(
        other.problem
    )


def test_deploy_refuses_references_that_do_not_resolve_where_used(redis: Any, key: bytes) -> None:
    hmac_env = PipelineConfig.model_validate(doc({"hmac_sha256": {"secret": {"env": "HOOK_KEY"}}}))
    stored = PipelineConfig.model_validate(doc({"bearer": {"token": {"secret": "HOOK_TOKEN"}}}))
    # no live gateway: an env reference cannot be checked, a stored one can
    assert secret_reference_problems(hmac_env, redis, "p.yaml") == []
    (line,) = secret_reference_problems(stored, redis, "p.yaml")
    assert line.startswith("p.yaml: spec.sources[0].http.auth.bearer.token: secret 'HOOK_TOKEN'")
    assert "eventbus secret set HOOK_TOKEN" in line
    SecretStore(redis, key).set("HOOK_TOKEN", b"t")
    assert secret_reference_problems(stored, redis, "p.yaml") == []
    # a live gateway without HOOK_KEY, one with it, a stale one
    now = time.time()
    gw = {"at": now, "env": env_digests({"PATH": "/bin"})}
    redis.hset(keys.GATEWAY_ENV, "gw-1", json.dumps(gw))
    (line,) = secret_reference_problems(hmac_env, redis, "p.yaml", now=now)
    assert "environment variable HOOK_KEY is not set where the gateway runs" in line
    assert "1 of 1 live gateways" in line and "HOOK_KEY" in line
    gw["env"] = env_digests({"PATH": "/bin", "HOOK_KEY": "v"})
    redis.hset(keys.GATEWAY_ENV, "gw-1", json.dumps(gw))
    redis.hset(keys.GATEWAY_ENV, "gw-old", json.dumps({"at": now - 600, "env": []}))
    assert secret_reference_problems(hmac_env, redis, "p.yaml", now=now) == []
    # the published entry holds no variable name
    assert "HOOK_KEY" not in redis.hget(keys.GATEWAY_ENV, "gw-1")


def test_sink_and_kafka_client_references_are_checked_too(redis: Any) -> None:
    d = doc({"hmac_sha256": {"secret": {"secret": "A"}}})
    d["spec"]["sink"] = {
        "kafka": {
            "topic": "out",
            "client": {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl": {"mechanism": "PLAIN", "username": "u", "password": {"secret": "KPASS"}},
            },
        }
    }
    lines = secret_reference_problems(PipelineConfig.model_validate(d), redis, "f.yaml")
    assert [ln.split(": secret ")[0] for ln in lines] == [
        "f.yaml: spec.sources[0].http.auth.hmac_sha256.secret",
        "f.yaml: spec.sink.kafka.client.sasl.password",
    ]


def test_an_enrich_steps_endpoint_secret_is_checked(redis: Any) -> None:
    d = doc({"hmac_sha256": {"secret": {"env": "A"}}})
    auth = {"bearer": {"token": {"secret": "CRM_TOKEN"}}}
    d["spec"]["steps"] = [{"id": "look", "enrich": {"http": {"url": "http://crm/c", "auth": auth}}}]
    (line,) = secret_reference_problems(PipelineConfig.model_validate(d), redis, "e.yaml")
    assert line.startswith(
        "e.yaml: spec.steps[0].enrich.http.auth.bearer.token: secret 'CRM_TOKEN'"
    )


def test_a_standard_webhooks_secret_is_checked_like_the_others(redis: Any, key: bytes) -> None:
    swh = PipelineConfig.model_validate(doc({"standard_webhooks": {"secret": {"secret": "WH"}}}))
    (line,) = secret_reference_problems(swh, redis, "w.yaml")
    assert line.startswith(
        "w.yaml: spec.sources[0].http.auth.standard_webhooks.secret: secret 'WH'"
    )
    SecretStore(redis, key).set("WH", b"whsec_" + b"a2V5a2V5a2V5a2V5")
    assert secret_reference_problems(swh, redis, "w.yaml") == []
    old = PipelineConfig.model_validate(doc({"standard_webhooks": {"secret_env": "WH_ENV"}}))
    (notice,) = deprecated_spellings(old)
    assert "standard_webhooks: secret_env is deprecated; write secret: {env: WH_ENV}" in notice


def test_old_spelling_keeps_working_with_a_notice() -> None:
    config = PipelineConfig.model_validate(doc({"hmac_sha256": {"secret_env": "HOOK_KEY"}}))
    (notice,) = deprecated_spellings(config)
    assert notice.startswith("spec.sources[0].http.auth.hmac_sha256: secret_env is deprecated")
    assert "write secret: {env: HOOK_KEY}" in notice
    table = RouteTable.from_documents(
        [doc({"hmac_sha256": {"secret_env": "HOOK_KEY"}})], {"HOOK_KEY": "v"}
    )
    cred = table.http_route("hooked").credentials
    assert cred is not None and cred.secret == b"v"
    new = PipelineConfig.model_validate(doc({"hmac_sha256": {"secret": {"env": "HOOK_KEY"}}}))
    assert deprecated_spellings(new) == []


def test_validate_prints_the_deprecation_notice_and_passes(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    path = tmp_path / "hooked.yaml"
    path.write_text(yaml.safe_dump(doc({"bearer": {"token_env": "HOOK_TOKEN"}})))
    r = subprocess.run(
        [sys.executable, "-m", "eventbus.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and f"{path}: ok" in r.stdout, r.stderr
    assert "spec.sources[0].http.auth.bearer: token_env is deprecated" in r.stderr
    assert "write token: {env: HOOK_TOKEN}" in r.stderr
