"""The admin API's routes on the gateway app, against a stand-in controller: each route
reaches its controller method with the request's arguments, the token guards every route,
and bad input (weights, a YAML of another pipeline, an oversized body) is refused by name."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from eventbus.gateway._admin import MAX_YAML_BYTES, add_admin_routes
from eventbus.gateway._http import build_http_app

AUTH = {"Authorization": "Bearer tok"}


class Controller:
    """Records each call as (method, args, kwargs) and answers a dict."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Any:
        calls = self.calls

        class Remote:
            async def remote(self, *args: Any, **kwargs: Any) -> Any:
                calls.append((method, args, kwargs))
                return {"method": method}

        return Remote()


def client(ingress_factory: Any, token: str | None, controller: Controller) -> httpx.AsyncClient:
    app = build_http_app(ingress_factory()[0])
    add_admin_routes(app, token, controller=lambda: controller)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def test_every_route_reaches_its_controller_method(ingress_factory: Any) -> None:
    ctl = Controller()
    async with client(ingress_factory, "tok", ctl) as c:
        assert (await c.get("/v1/admin/pipelines", headers=AUTH)).json() == {"method": "list"}
        assert (await c.get("/v1/admin/pipelines/p", headers=AUTH)).json() == {"method": "get"}
        assert (await c.delete("/v1/admin/pipelines/p", headers=AUTH)).status_code == 204
        for path, method in [
            ("versions", "versions"),
            ("status", "status"),
            ("canary", "canary_status"),
        ]:
            r = await c.get(f"/v1/admin/pipelines/p/{path}", headers=AUTH)
            assert r.status_code == 200 and r.json() == {"method": method}, r.text
        r = await c.post("/v1/admin/pipelines/p/rollback?to=2", headers=AUTH)
        assert r.json() == {"method": "rollback"}
        yaml_text = "kind: Pipeline\nmetadata: {name: p}\n"
        r = await c.post(
            "/v1/admin/pipelines/p/canary?weights=5,100&step_s=2",
            content=yaml_text.encode(),
            headers=AUTH,
        )
        assert r.status_code == 201, r.text
    assert [c[0] for c in ctl.calls] == [
        "list",
        "get",
        "delete",
        "versions",
        "status",
        "canary_status",
        "rollback",
        "deploy_canary",
    ]
    assert ctl.calls[6][1] == ("p", 2)
    assert ctl.calls[7][1][0] == yaml_text and ctl.calls[7][2] == {
        "weights": [5, 100],
        "step_s": 2.0,
    }


async def test_the_token_guards_every_route(ingress_factory: Any) -> None:
    ctl = Controller()
    async with client(ingress_factory, "tok", ctl) as c:
        r = await c.get("/v1/admin/pipelines/p/status")
        assert r.status_code == 401 and "Bearer" in r.headers["www-authenticate"]
        r = await c.get("/v1/admin/pipelines", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.json()["error"] == "the admin token is not valid"
    async with client(ingress_factory, None, ctl) as c:
        r = await c.get("/v1/admin/pipelines", headers=AUTH)
        assert r.status_code == 404 and "EVENTBUS_ADMIN_TOKEN" in r.json()["error"]
    assert ctl.calls == []


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/admin/pipelines/p/canary?weights=a,b", b"kind: Pipeline", 400, "not integers"),
        (
            "/v1/admin/pipelines/p/canary",
            b"kind: Pipeline\nmetadata: {name: other}\n",
            400,
            "/v1/admin/pipelines/other/canary",
        ),
        ("/v1/admin/pipelines/p/canary", b"x" * (MAX_YAML_BYTES + 1), 413, "pipeline YAML over"),
        ("/v1/admin/pipelines", b"x" * (MAX_YAML_BYTES + 1), 413, "pipeline YAML over"),
        ("/v1/admin/pipelines", b"\xff\xfe", 400, "not UTF-8"),
    ],
)
async def test_bad_input_is_refused_by_name(
    ingress_factory: Any, path: str, body: bytes, status: int, needle: str
) -> None:
    ctl = Controller()
    async with client(ingress_factory, "tok", ctl) as c:
        r = await c.post(path, content=body, headers=AUTH)
    assert r.status_code == status and needle in r.json()["error"], r.text
    assert ctl.calls == []
