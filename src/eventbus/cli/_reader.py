"""The read-only pipeline commands (``list``, ``get``, ``versions``, ``status NAME``) through the
gateway's admin API when the recorded stack has one: a few milliseconds where connecting to
Ray as a driver costs seconds per command.

Used only when no Ray address is given (``--ray-address``, ``$RAY_ADDRESS``): the recorded
stack's gateway and its admin token (``$EVENTBUS_HOME/admin_token``, written by ``up``) are
then the same cluster's. A gateway that does not answer, or whose admin API is off, makes the
command fall back to the controller over Ray: never a different answer, only a slower one.
"""

from __future__ import annotations

import builtins  # `GatewayReader.list` shadows `list` in the annotations after it
from collections.abc import Callable
from typing import Any

from eventbus.cli._common import Addresses, controller_client, home
from eventbus.errors import EventBusError, PipelineNotFoundError

__all__ = ["GatewayReader", "reader"]


class _Unavailable(Exception):
    """The gateway cannot answer this (down, admin API off): ask the controller instead."""


class GatewayReader:
    """``list``/``get``/``versions``/``status`` over ``GET /v1/admin/...``, falling back to the
    Ray client (made on first need) for a call the gateway cannot answer."""

    def __init__(self, base_url: str, token: str, fallback: Callable[[], Any]) -> None:
        self.base_url = base_url.rstrip("/") + "/v1/admin"
        self.token = token
        self.fallback = fallback  # the controller's Ray client, made when first needed

    def _get(self, path: str) -> Any:
        import httpx

        try:
            r = httpx.get(
                self.base_url + path,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=30,
            )
        except httpx.TransportError as exc:
            raise _Unavailable(str(exc)) from None
        try:
            body = r.json()
        except ValueError:
            raise _Unavailable(f"HTTP {r.status_code}: not JSON") from None
        if r.status_code == 200:
            return body
        error = str(body.get("error", body)) if isinstance(body, dict) else str(body)
        if r.status_code == 404 and "admin API is off" not in error:
            raise PipelineNotFoundError(error)
        if r.status_code in (401, 404, 502, 503, 504):  # wrong token, off, controller away
            raise _Unavailable(error)
        raise EventBusError(error)

    def _call(self, method: str, path: str, *args: Any) -> Any:
        try:
            return self._get(path)
        except _Unavailable:
            return getattr(self.fallback(), method)(*args)

    def list(self) -> list[dict[str, Any]]:
        """The deployed pipelines."""
        return self._call("list", "/pipelines")  # type: ignore[no-any-return]

    def get(self, name: str) -> dict[str, Any]:
        """A pipeline's stored record (without its Python path)."""
        return self._call("get", f"/pipelines/{name}", name)  # type: ignore[no-any-return]

    def versions(self, name: str) -> builtins.list[dict[str, Any]]:
        """A pipeline's kept versions, newest first."""
        return self._call("versions", f"/pipelines/{name}/versions", name)  # type: ignore[no-any-return]

    def status(self, name: str) -> dict[str, Any]:
        """A pipeline's version and live counters."""
        return self._call("status", f"/pipelines/{name}/status", name)  # type: ignore[no-any-return]


def reader(addr: Addresses) -> Any:
    """A :class:`GatewayReader` for the recorded stack's gateway when no Ray address was given
    and ``up`` wrote the admin token; else the controller's Ray client."""
    import re

    from eventbus._internal.stack import load_stack

    if addr.ray is None:
        stack = load_stack(home())
        token_file = home() / "admin_token"
        if stack is not None and stack.gateway_http and token_file.exists():
            token = token_file.read_text().strip()
            if token and re.fullmatch(r"[\x21-\x7e]+", token):
                return GatewayReader(stack.gateway_http, token, lambda: controller_client(addr))
    return controller_client(addr)
