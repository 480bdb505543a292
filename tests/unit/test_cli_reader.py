"""The read-only CLI commands through the gateway's admin API (``cli/_reader.py``), against the
real admin routes on a real HTTP server with a stand-in controller: the answers are the
controller's, an unknown pipeline is a PipelineNotFoundError with the controller's message, and
a gateway that is down or has its admin API off falls back to the controller's Ray client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from eventbus._internal.services import free_port
from eventbus.cli._reader import GatewayReader
from eventbus.errors import PipelineNotFoundError
from eventbus.gateway._admin import add_admin_routes

RECORDS = {
    "orders": {"name": "orders", "version": 3, "yaml": "kind: Pipeline\n", "python_path": []}
}


class Controller:
    """The controller's read methods over a dict of records."""

    def __getattr__(self, method: str) -> Any:
        class Remote:
            async def remote(self, *args: Any) -> Any:
                if method == "list":
                    return [{"name": n, "status": "RUNNING"} for n in RECORDS]
                (name,) = args
                if name not in RECORDS:
                    raise PipelineNotFoundError(f"no pipeline named {name!r} is deployed")
                return {"get": RECORDS[name], "versions": [{"version": 3, "serving": True}],
                        "status": {"version": 3, "figures": None}}[method]  # fmt: skip

        return Remote()


def serve(token: str | None) -> Iterator[str]:
    app = FastAPI()
    add_admin_routes(app, token, controller=Controller)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the admin app did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    yield from serve("tok")


@pytest.fixture(scope="module")
def gateway_without_admin() -> Iterator[str]:
    yield from serve(None)


class Fallback:
    """The Ray client's stand-in: counts the calls the gateway could not answer."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append(method)
            return {"from": "ray", "method": method}

        return call


def test_answers_are_the_controllers(gateway: str) -> None:
    fallback = Fallback()
    r = GatewayReader(gateway, "tok", lambda: fallback)
    assert r.list() == [{"name": "orders", "status": "RUNNING"}]
    assert r.get("orders") == {k: v for k, v in RECORDS["orders"].items() if k != "python_path"}
    assert r.versions("orders") == [{"version": 3, "serving": True}]
    assert r.status("orders") == {"version": 3, "figures": None}
    with pytest.raises(PipelineNotFoundError, match="no pipeline named 'nope' is deployed"):
        r.get("nope")
    assert fallback.calls == []  # nothing went to Ray


def test_down_off_or_refused_falls_back_to_ray(gateway: str, gateway_without_admin: str) -> None:
    fallback = Fallback()
    down = GatewayReader(f"http://127.0.0.1:{free_port()}", "tok", lambda: fallback)
    assert down.list() == {"from": "ray", "method": "list"}
    off = GatewayReader(gateway_without_admin, "tok", lambda: fallback)
    assert off.get("orders") == {"from": "ray", "method": "get"}
    wrong_token = GatewayReader(gateway, "not-the-token", lambda: fallback)
    assert wrong_token.status("orders") == {"from": "ray", "method": "status"}
    assert fallback.calls == ["list", "get", "status"]
