"""The one Redis client factory: URL forms, refused parameters, explained errors."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import pytest
import redis

from eventbus._internal.redis_client import (
    connect,
    connect_async,
    explain,
    is_cluster,
    redact,
    with_ca,
)
from eventbus.errors import ConfigError

URL = "rediss://eventbus:hunter2@10.0.0.5:6380/0"


def test_plain_and_tls_urls_make_a_redis_client() -> None:
    r = connect("redis://127.0.0.1:1/3", socket_timeout=1)
    assert isinstance(r, redis.Redis)
    assert r.connection_pool.connection_kwargs["db"] == 3
    t = connect(URL + "?ssl_ca_certs=/ca.pem&ssl_check_hostname=false")
    kw = t.connection_pool.connection_kwargs
    assert kw["username"] == "eventbus" and kw["password"] == "hunter2"
    assert kw["ssl_ca_certs"] == "/ca.pem" and kw["ssl_check_hostname"] is False
    assert t.connection_pool.connection_class is redis.SSLConnection
    import redis.asyncio as aioredis

    assert isinstance(connect_async("redis://127.0.0.1:1/0"), aioredis.Redis)


def test_cluster_schemes() -> None:
    assert is_cluster("redis+cluster://127.0.0.1:7000")
    assert is_cluster("rediss+cluster://u:p@127.0.0.1:7000?ssl_ca_certs=/ca.pem")
    assert not is_cluster("rediss://127.0.0.1:7000")
    with pytest.raises(ConfigError, match=re.escape("a Redis Cluster has database 0 only; got /2")):
        is_cluster("redis+cluster://127.0.0.1:7000/2")


def test_unknown_scheme_and_parameter_are_named_with_the_password_redacted() -> None:
    with pytest.raises(ConfigError, match=re.escape("unknown scheme 'redis-cluster'")) as info:
        connect("redis-cluster://u:hunter2@h:1")
    assert "hunter2" not in str(info.value)
    with pytest.raises(
        ConfigError, match=re.escape("unknown query parameter(s) ssl_ca; known: db, health_check")
    ) as info:
        connect(URL + "?ssl_ca=/ca.pem")
    assert "hunter2" not in str(info.value) and "eventbus:***@10.0.0.5:6380" in str(info.value)


def test_redact() -> None:
    assert redact(URL) == "rediss://eventbus:***@10.0.0.5:6380/0"
    assert redact("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact("redis://h:1/0") == "redis://h:1/0"


def test_with_ca(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    assert with_ca("rediss://h:1/0?ssl_check_hostname=false", ca).endswith(
        f"ssl_check_hostname=false&ssl_ca_certs={str(ca).replace('/', '%2F')}"
    )
    with pytest.raises(ConfigError, match="is plaintext: use rediss://"):
        with_ca("redis://:pw@h:1/0", ca)
    with pytest.raises(ConfigError, match="does not exist"):
        with_ca("rediss://h:1/0", tmp_path / "missing.pem")


def test_explain_names_the_cause_and_the_fix() -> None:
    auth = explain(URL, redis.AuthenticationError("invalid username-password pair"))
    assert auth.startswith("Redis at rediss://eventbus:***@10.0.0.5:6380/0 refused the credentials")
    assert "ACL GETUSER eventbus" in auth and "hunter2" not in auth
    noauth = explain("redis://h:1/0", redis.ResponseError("NOAUTH Authentication required."))
    assert "requires a password and the URL has none" in noauth
    err = redis.ConnectionError("Error 1 connecting")
    err.__cause__ = ssl.SSLCertVerificationError("certificate verify failed")
    assert "TLS certificate is not trusted" in explain(URL, err)
    down = explain("redis://h:1/0", redis.ConnectionError("Connection refused"))
    assert down.endswith(
        "is unreachable (ConnectionError: Connection refused); check the host and port"
    )


def test_every_redis_client_comes_from_the_factory() -> None:
    src = Path(__file__).resolve().parents[3] / "src" / "eventbus"
    makers = re.compile(r"\.from_url\(|\bRedis\(|RedisCluster\(")
    found = [
        f"{p.relative_to(src)}:{n}"
        for p in src.rglob("*.py")
        if p.name != "redis_client.py"
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if makers.search(line)
    ]
    assert found == []


def test_unix_socket_urls_are_kept() -> None:
    r = connect("unix:///tmp/redis.sock?db=2")
    assert r.connection_pool.connection_kwargs["path"] == "/tmp/redis.sock"
