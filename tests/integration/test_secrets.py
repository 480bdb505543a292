"""Secrets as platform objects on the real stack: ``eventbus secret set/list/delete`` (the CLI,
values on stdin), a pipeline whose HMAC secret is ``{secret: NAME}``, a running gateway that
picks up the secret and its rotation without a restart, and ``deploy`` refusing references
that would not resolve where they are used (a stored secret not set, an environment variable
the gateway does not have), naming them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from eventbus._internal.secret_store import KEY_ENV, MAX_VALUE_BYTES
from eventbus.errors import PipelineConfigError
from eventbus.eventing._signature import sign_request
from tests.integration.test_dashboard import Gateway, OtlpReceiver, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]


@pytest.fixture(scope="module")
def stack_key() -> Iterator[str]:
    """The stack's secret key, in this process's environment (the CLI and the gateway it
    starts inherit it)."""
    with pytest.MonkeyPatch.context() as mp:
        key = Fernet.generate_key().decode()
        mp.setenv(KEY_ENV, key)
        mp.delenv("EB_IT_NOT_IN_GATEWAY", raising=False)
        yield key


@pytest.fixture(scope="module")
def secrets_gateway(
    stack_key: str,
    ray_cluster: None,
    eventbus_client: Any,
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    otlp = OtlpReceiver()
    gw = Gateway(kafka_bootstrap, redis_url, otlp.url, tmp_path_factory.mktemp("gw") / "gw.log")
    yield gw
    gw.stop()
    otlp.close()


def secret(redis_url: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "eventbus.cli", "secret", *args, "--redis-url", redis_url]
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=60, env=os.environ)


def pipeline(tmp: Path, name: str, auth_secret: dict[str, str], kafka: str) -> Path:
    import yaml

    from eventbus._internal.services import create_topics
    from tests.fixtures.services import _run_in_thread

    _run_in_thread(lambda: create_topics(kafka, [f"{name}-out"], 1))  # the sink's topic

    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [
                {"http": {"path": f"/{name}", "auth": {"hmac_sha256": {"secret": auth_secret}}}}
            ],
            "sink": {"kafka": {"topic": f"{name}-out"}},
            "serving": {"replicas": 1},
        },
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def post(gw: Gateway, name: str, key: str) -> int:
    body = b'{"n": 1}'
    headers = {"content-type": "application/json"}
    url = f"{gw.url}/{name}"
    sig = sign_request(key, "POST", url, headers, body)
    r = httpx.post(url, content=body, headers={**headers, "x-eventbus-signature": sig}, timeout=10)
    return r.status_code


def test_cli_set_list_delete_and_hostile_input(redis_url: str, stack_key: str) -> None:
    name = f"IT_{uuid.uuid4().hex[:6].upper()}"
    r = secret(redis_url, "set", name, stdin=b"value-one\n")
    assert r.returncode == 0 and b"set" in r.stdout, r.stderr
    r = secret(redis_url, "set", name, stdin=b"value-two")
    assert r.returncode == 0 and b"rotated" in r.stdout, r.stderr
    r = secret(redis_url, "list")
    assert r.returncode == 0 and name.encode() in r.stdout and b"value" not in r.stdout
    r = secret(redis_url, "set", "bad name", stdin=b"x")
    assert r.returncode == 1 and b"'bad name' is not valid" in r.stderr
    r = secret(redis_url, "set", "HUGE", stdin=b"x" * (MAX_VALUE_BYTES + 10))
    assert r.returncode == 1 and f"more than {MAX_VALUE_BYTES}".encode() in r.stderr
    r = secret(redis_url, "set", "EMPTY", stdin=b"")
    assert r.returncode == 1 and b"the value is empty" in r.stderr
    assert secret(redis_url, "delete", name).returncode == 0
    r = secret(redis_url, "delete", name)
    assert r.returncode == 1 and b"no secret named" in r.stderr
    assert name.encode() not in secret(redis_url, "list").stdout


def test_stored_hmac_secret_is_refused_until_set_then_rotated_without_restart(
    secrets_gateway: Gateway,
    eventbus_client: Any,
    redis_url: str,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:6]
    name, ref = f"sec-{tag}", f"HOOK_{tag.upper()}"
    path = pipeline(tmp_path, name, {"secret": ref}, kafka_bootstrap)
    with pytest.raises(PipelineConfigError) as info:
        eventbus_client.deploy(path)
    assert f"secret {ref!r} is not set on the stack" in str(info.value)
    assert f"eventbus secret set {ref}" in str(info.value)
    assert secret(redis_url, "set", ref, stdin=b"first-key").returncode == 0
    eventbus_client.deploy(path)
    try:
        wait_for(lambda: post(secrets_gateway, name, "first-key") == 202, 60)
        assert post(secrets_gateway, name, "wrong-key") == 401
        # rotate: the running gateway takes the new secret and refuses the old one
        assert secret(redis_url, "set", ref, stdin=b"second-key").returncode == 0
        wait_for(lambda: post(secrets_gateway, name, "second-key") == 202, 30)
        assert post(secrets_gateway, name, "first-key") == 401
        assert secrets_gateway.proc.poll() is None  # the same process throughout
        log = secrets_gateway.log.read_text()
        assert "first-key" not in log and "second-key" not in log  # never logged
    finally:
        eventbus_client.delete(name)
        secret(redis_url, "delete", ref)


def test_deploy_refuses_an_env_reference_the_gateway_does_not_have(
    secrets_gateway: Gateway, eventbus_client: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    name = f"senv-{uuid.uuid4().hex[:6]}"
    with pytest.raises(PipelineConfigError) as info:
        eventbus_client.deploy(
            pipeline(tmp_path, name, {"env": "EB_IT_NOT_IN_GATEWAY"}, kafka_bootstrap)
        )
    text = str(info.value)
    assert "spec.sources[0].http.auth.hmac_sha256.secret" in text
    assert "environment variable EB_IT_NOT_IN_GATEWAY is not set where the gateway runs" in text
    assert "503" in text and "eventbus secret set" in text
    assert name not in [p["name"] for p in eventbus_client.list()]
    # a variable the gateway has passes
    ok = f"senv-{uuid.uuid4().hex[:6]}"
    eventbus_client.deploy(pipeline(tmp_path, ok, {"env": KEY_ENV}, kafka_bootstrap))
    eventbus_client.delete(ok)
