"""The HTTP transports: the gateways' ``/v1/pipelines/{name}/events`` over ``httpx``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from eventbus._client._registry import ClusterInfo
from eventbus._client._router import Unavailable
from eventbus._client._transport import _refused
from eventbus.eventing._event import CloudEvent

__all__ = ["AsyncHttpTransport", "HttpTransport"]


def _answer(
    cluster: ClusterInfo, pipeline: str, status: int, headers: Mapping[str, str], body: bytes
) -> Any:
    """Decode a gateway answer; raise Unavailable (fail over) or IngressError (the caller's)."""
    if status in (200, 202, 204):
        if status == 202:
            return json.loads(body)["ids"]
        if status == 204:
            return []
        from eventbus.eventing._http_codec import decode_http

        events, _ = decode_http(
            {k.lower(): v for k, v in headers.items()},
            body,
            default_type="eventbus.output",
            default_source="/eventbus",
        )
        return events
    try:
        message = str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode(errors="replace") or "(no body)"
    reason = f"HTTP {status}: {message}"
    if status >= 500:
        raise Unavailable(reason, status=status)
    if status == 404:  # maybe not deployed on this cluster: try the others before giving up
        raise Unavailable(reason, mark_down=False, status=404)
    raise _refused(cluster, pipeline, status, message)


def _http_request(
    cluster: ClusterInfo, pipeline: str, events: list[CloudEvent], wait: bool
) -> tuple[str, list[tuple[str, str]], bytes]:
    from eventbus.eventing._http_codec import encode_http_batch, encode_http_binary

    if cluster.gateway is None:
        reason = f"cluster {cluster.name!r} has no HTTP gateway registered"
        raise Unavailable(reason, mark_down=False)
    url = f"{cluster.gateway.rstrip('/')}/v1/pipelines/{quote(pipeline, safe='')}/events"
    headers, body = encode_http_binary(events[0]) if wait else encode_http_batch(events)
    # explicit both ways: a mode: sync source answers a request without ?wait synchronously
    return url + ("?wait=true" if wait else "?wait=false"), headers, body


class HttpTransport:
    """HTTP to the gateways with one pooled ``httpx.Client``."""

    def __init__(self, timeout_s: float, headers: Mapping[str, str] | None = None) -> None:
        import httpx

        self._httpx = httpx
        self._http = httpx.Client(timeout=timeout_s, headers=dict(headers or {}))

    def _post(
        self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent], wait: bool
    ) -> Any:
        url, headers, body = _http_request(cluster, pipeline, events, wait)
        try:
            r = self._http.post(url, content=body, headers=headers)
        except self._httpx.TransportError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            raise Unavailable(reason) from None
        return _answer(cluster, pipeline, r.status_code, r.headers, r.content)

    def publish(self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent]) -> list[str]:
        return self._post(cluster, pipeline, events, False)  # type: ignore[no-any-return]

    def invoke(self, cluster: ClusterInfo, pipeline: str, event: CloudEvent) -> list[CloudEvent]:
        return self._post(cluster, pipeline, [event], True)  # type: ignore[no-any-return]

    def close(self) -> None:
        self._http.close()


class AsyncHttpTransport:
    """HTTP to the gateways with one pooled ``httpx.AsyncClient``."""

    def __init__(
        self, timeout_s: float, headers: Mapping[str, str] | None = None, max_connections: int = 100
    ) -> None:
        import httpx

        self._httpx = httpx
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._http = httpx.AsyncClient(
            timeout=timeout_s, headers=dict(headers or {}), limits=limits
        )

    async def _post(
        self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent], wait: bool
    ) -> Any:
        url, headers, body = _http_request(cluster, pipeline, events, wait)
        try:
            r = await self._http.post(url, content=body, headers=headers)
        except self._httpx.TransportError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            raise Unavailable(reason) from None
        return _answer(cluster, pipeline, r.status_code, r.headers, r.content)

    async def publish(
        self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent]
    ) -> list[str]:
        return await self._post(cluster, pipeline, events, False)  # type: ignore[no-any-return]

    async def invoke(
        self, cluster: ClusterInfo, pipeline: str, event: CloudEvent
    ) -> list[CloudEvent]:
        return await self._post(cluster, pipeline, [event], True)  # type: ignore[no-any-return]

    async def close(self) -> None:
        await self._http.aclose()
