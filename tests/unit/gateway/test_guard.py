"""The gateway's front door: the optional read token of what it shows, and the Origin check of
state-changing browser requests."""

from __future__ import annotations

import re

import httpx
import pytest

from eventbus.errors import ConfigError
from eventbus.gateway._admin import read_token_from
from eventbus.gateway._guard import READ_COOKIE, guard
from eventbus.gateway._http import build_http_app
from eventbus.gateway._observer import Observer

READ = "r3ad-token"
ADMIN = "adm1n-token"
READ_ROUTES = [
    "/metrics",
    "/v1/stats",
    "/v1/history",
    "/v1/pipelines",
    "/v1/pipelines/open/stats",
    "/v1/pipelines/open/history",
    "/dashboard",
]


class NoRedis:
    async def hgetall(self, key):
        return {}

    async def hget(self, key, field):
        return None

    async def hexists(self, key, field):
        return False

    async def hkeys(self, key):
        return []


def make_client(ingress_factory, **options) -> httpx.AsyncClient:
    ingress, backend = ingress_factory()
    app = guard(build_http_app(ingress, observer=Observer(NoRedis())), **options)
    c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    c.backend = backend  # type: ignore[attr-defined]
    return c


async def test_read_routes_are_open_without_a_read_token(ingress_factory) -> None:
    async with make_client(ingress_factory) as c:
        for path in READ_ROUTES[:4]:
            assert (await c.get(path)).status_code == 200, path


@pytest.mark.parametrize("path", READ_ROUTES)
async def test_read_routes_need_the_read_token_when_set(ingress_factory, path) -> None:
    async with make_client(ingress_factory, read_tokens=[READ, ADMIN]) as c:
        r = await c.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["error"].startswith(f"{path} needs the gateway's read token")
        assert (await c.get(path, headers={"authorization": "Bearer wrong"})).status_code == 401
        ok = await c.get(path, headers={"authorization": f"Bearer {READ}"})
        assert ok.status_code in (200, 404), ok.text  # 404: a pipeline without figures
        assert ok.status_code != 401
        admin = await c.get(path, headers={"authorization": f"Bearer {ADMIN}"})
        assert admin.status_code == ok.status_code


async def test_the_dashboard_takes_the_token_once_then_a_cookie(ingress_factory) -> None:
    async with make_client(ingress_factory, read_tokens=[READ]) as c:
        assert (await c.get("/dashboard?token=nope")).status_code == 401
        r = await c.get(f"/dashboard?token={READ}")
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"{READ_COOKIE}={READ};")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        # the page and its own requests (/v1/stats) now carry the cookie
        page = await c.get("/dashboard")
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert (await c.get("/v1/stats")).status_code == 200
        c.cookies.clear()
        assert (await c.get("/v1/stats")).status_code == 401


async def test_events_and_health_do_not_need_the_read_token(ingress_factory) -> None:
    async with make_client(ingress_factory, read_tokens=[READ]) as c:
        health = await c.get("/healthz")
        assert health.status_code == 200
        assert health.json() == {"status": "ok"}  # no pipeline names without the token
        named = await c.get("/healthz", headers={"authorization": f"Bearer {READ}"})
        assert "open" in named.json()["pipelines"]
        r = await c.post("/v1/pipelines/open/events", json={"amount": 1})
        assert r.status_code == 202


async def test_a_post_from_another_origin_is_403(ingress_factory) -> None:
    async with make_client(ingress_factory) as c:
        r = await c.post(
            "/v1/pipelines/open/events",
            json={"amount": 1},
            headers={"origin": "https://evil.example"},
        )
        assert r.status_code == 403
        assert r.json()["error"] == (
            "requests from web pages of origin 'https://evil.example' are refused (the gateway "
            "is http://gw); start the gateway with --allowed-origin https://evil.example if that "
            "page may send to it"
        )
        r = await c.post("/hooks/open", json={}, headers={"origin": "null"})
        assert r.status_code == 403
        r = await c.delete("/v1/admin/pipelines/x", headers={"origin": "https://evil.example"})
        assert r.status_code == 403
        assert "open" not in c.backend.published


async def test_same_origin_allowed_origins_and_no_origin_pass(ingress_factory) -> None:
    async with make_client(ingress_factory, allowed_origins=["https://shop.example/"]) as c:
        for headers in ({}, {"origin": "http://gw"}, {"origin": "https://shop.example"}):
            r = await c.post("/v1/pipelines/open/events", json={"amount": 1}, headers=headers)
            assert r.status_code == 202, headers
        # reads are not state-changing: an Origin does not matter there
        assert (await c.get("/v1/pipelines", headers={"origin": "https://x"})).status_code == 200


def test_read_token_from_the_environment_or_a_file(tmp_path) -> None:
    assert read_token_from({}) is None
    assert read_token_from({"EVENTBUS_READ_TOKEN": " abc \n"}) == "abc"
    f = tmp_path / "read"
    f.write_text("from-file\n")
    assert read_token_from({"EVENTBUS_READ_TOKEN_FILE": str(f)}) == "from-file"
    with pytest.raises(ConfigError, match=re.escape("cannot be read")):
        read_token_from({"EVENTBUS_READ_TOKEN_FILE": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="characters other than letters"):
        read_token_from({"EVENTBUS_READ_TOKEN": "a b;c"})
