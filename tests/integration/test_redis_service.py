"""The embedded Redis of ``eventbus up``: a password carried in its URL (never on the command
line), and a memory limit at which writes fail loudly and nothing is evicted."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import redis

from eventbus._internal.redis_service import start_redis
from eventbus._internal.stack import redact

pytestmark = [pytest.mark.integration, pytest.mark.redis]

PASSWORD = "0123456789abcdef" * 4


def test_password_and_memory_limit(tmp_path: Path) -> None:
    svc = start_redis(data_dir=tmp_path, password=PASSWORD, maxmemory="64mb")
    try:
        assert svc.address.startswith(f"redis://:{PASSWORD}@127.0.0.1:")
        port = int(svc.address.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        client = redis.Redis.from_url(svc.address)
        assert client.ping()
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("maxmemory") == {"maxmemory": str(64 * 1024 * 1024)}
        cmdline = Path(f"/proc/{svc.pid}/cmdline").read_bytes()
        assert PASSWORD.encode() not in cmdline
        (conf,) = tmp_path.glob("redis-*.conf")
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600
        assert PASSWORD not in redact(svc.address) and "***" in redact(svc.address)
        # at the limit: a write fails loudly, and a key with a TTL (a join window) is kept
        client.set("window", "pending", ex=600)
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            for i in range(200):
                client.set(f"fill:{i}", b"x" * (1 << 20))
        assert client.get("window") == b"pending"
    finally:
        svc.stop()


def test_without_a_password_nothing_changes(tmp_path: Path) -> None:
    svc = start_redis(data_dir=tmp_path)
    try:
        assert svc.address.startswith("redis://127.0.0.1:")
        assert redis.Redis.from_url(svc.address).ping()
        assert redact(svc.address) == svc.address
    finally:
        svc.stop()
