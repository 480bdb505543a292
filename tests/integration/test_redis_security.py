"""Redis over TLS with an ACL user, on Debian's redis-server on loopback (nothing mocked).

The server serves TLS only (``port 0``), its ``default`` user is off and the ACL user
``eventbus`` may touch ``eventbus:*`` keys only. Join state and dedupe run over it through the
one client factory; a wrong password or an untrusted certificate fails at start, named.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from eventbus._internal import keys
from eventbus._internal.redis_client import check_redis, connect, connect_async, with_ca
from eventbus._internal.stack import stack_up
from eventbus.errors import StackError
from eventbus.eventing._delivery import RedisDeduper
from eventbus.pipelines.steps._join_state import RedisJoinState
from tests.fixtures.redis_secure import RedisTls

pytestmark = [pytest.mark.integration, pytest.mark.redis]


def test_tls_acl_clients_sync_and_async(redis_tls: RedisTls) -> None:
    url = redis_tls.url()
    check_redis(url)
    r = connect(url)
    assert r.acl_whoami() in ("eventbus", b"eventbus")
    r.set("eventbus:probe", "1")
    r.close()

    async def probe() -> bytes:
        a = connect_async(url)
        try:
            return bytes(await a.get("eventbus:probe"))
        finally:
            await a.aclose()

    assert asyncio.run(probe()) == b"1"
    # --redis-ca FILE is the same as ?ssl_ca_certs=FILE
    with_file = with_ca(redis_tls.url(ca=False), redis_tls.ca_file)
    assert parse_qs(urlsplit(with_file).query) == {"ssl_ca_certs": [str(redis_tls.ca_file)]}
    check_redis(with_ca(redis_tls.url(ca=False), redis_tls.ca_file))


def test_join_over_tls(redis_tls: RedisTls) -> None:
    state = RedisJoinState(redis_tls.url(), keys.join_prefix("tls", "pair"))
    first = state.join(1_000, 60_000, 2, 100, [("k1", "orders", b'{"o":1}', "o1", 1_000, "-")])
    assert first == [0]
    second = state.join(1_001, 60_000, 2, 100, [("k1", "payments", b'{"p":1}', "p1", 1_001, "-")])
    joined = second[0]
    assert isinstance(joined, dict)
    assert joined["orders"] == b'{"o":1}' and joined["payments"] == b'{"p":1}'


class _Sink:
    config = None

    async def positions(self) -> None:
        return None


def test_dedupe_over_tls(redis_tls: RedisTls) -> None:
    async def run() -> tuple[list[bool], list[bool]]:
        d = RedisDeduper(redis_tls.url(), "tls", 60)
        try:
            ks = d.digests(["/s\x00a", "/s\x00b"])
            await d.mark(ks[:1], hashed=True)
            first = await d.claim(ks, _Sink())
            await d.mark(ks[1:], hashed=True)  # b delivered
            again = await d.claim(ks, _Sink())
            assert d.errors == 0
            return first, again
        finally:
            await d.close()

    first, again = asyncio.run(run())
    assert first == [True, False]
    assert again == [True, True]


def test_wrong_password_fails_at_start_named_and_redacted(
    redis_tls: RedisTls, tmp_path: Path
) -> None:
    bad = redis_tls.url(password="wrongPassword")
    expect = (
        f"Redis at rediss://eventbus:***@127.0.0.1:{redis_tls.port}/0?ssl_ca_certs="
        f"{redis_tls.ca_file} refused the credentials of user 'eventbus'"
    )
    with pytest.raises(StackError, match=re.escape(expect)) as info:
        check_redis(bad)
    assert "wrongPassword" not in str(info.value)
    assert "ACL GETUSER eventbus" in str(info.value)
    # `eventbus up --redis-url` pings before starting anything
    with pytest.raises(StackError, match=re.escape(expect)):
        stack_up(
            tmp_path,
            ray_address="127.0.0.1:1",
            kafka_bootstrap="127.0.0.1:1",
            redis_url=bad,
            gateway=False,
        )


def test_untrusted_certificate_names_the_ca_fix(redis_tls: RedisTls) -> None:
    with pytest.raises(StackError, match="TLS certificate is not trusted") as info:
        check_redis(redis_tls.url(ca=False))
    assert "ssl_ca_certs=" in str(info.value) and "--redis-ca" in str(info.value)
    assert redis_tls.password not in str(info.value)
