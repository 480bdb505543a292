"""The clients: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from eventbus._client._base import _as_events, _BaseClient, _one_event
from eventbus._client._grpc import AsyncGrpcTransport, GrpcTransport
from eventbus._client._http import AsyncHttpTransport, HttpTransport
from eventbus._client._registry import ClusterInfo
from eventbus._client._router import Unavailable
from eventbus._client._transport import Accepted, AsyncTransport, SyncTransport
from eventbus.eventing._event import CloudEvent

__all__ = ["AsyncClient", "Client"]


class Client(_BaseClient):
    """Publish and invoke at the gateways of every cluster a keeper registered.

    Args:
        keeper_redis: the keeper's Redis URL (registry in the key ``eventbus:keeper:clusters``).
        keeper_file: or a registry file written by a keeper.
        gateways: or fixed gateways: HTTP URLs, gRPC ``host:port`` or :class:`ClusterInfo`.
        prefer_local: send to the local cluster (``local`` in the registry, or
            ``local_cluster``) while its weight is above 0 and it answers.
        local_cluster: the name of this client's local cluster (overrides the registry flag).
        transport: ``"http"`` or ``"grpc"`` (or a transport object, for tests).
        timeout_s: per-request timeout; past it the next cluster is tried.
        refresh_s: re-read the registry this often.
        backoff_s: a cluster that failed is skipped this long, doubling per failure in a row
            (50-100 % of it, drawn at random: clients do not come back in lockstep).
        max_backoff_s: the longest a failed cluster is skipped.
        retries: when every cluster failed, try them all again this many times (after
            ``retry_delay_s``, doubling up to ``max_backoff_s``, full jitter) before raising.
        retry_delay_s: the longest pause before the first extra round.
        seed: seed of the weighted draw (reproducible spreading in tests).
        headers: extra HTTP headers (``authorization: Bearer ...``) or gRPC metadata.

    Example:
        >>> import eventbus
        >>> with eventbus.Client(keeper_redis="redis://127.0.0.1:6379/0") as client:  # doctest: +SKIP
        ...     ids = client.publish("orders", {"amount": 5}, type="order.created", source="/shop")
        ...     outputs = client.invoke("orders", eventbus.CloudEvent.create(type="order.created", source="/shop", data={"amount": 5}))
    """

    def __init__(
        self,
        keeper_redis: str | None = None,
        *,
        keeper_file: str | Path | None = None,
        gateways: Sequence[str | ClusterInfo | Mapping[str, Any]] | None = None,
        prefer_local: bool = True,
        local_cluster: str | None = None,
        transport: Literal["http", "grpc"] | SyncTransport = "http",
        timeout_s: float = 10.0,
        refresh_s: float = 5.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        retries: int = 1,
        retry_delay_s: float = 0.2,
        seed: int | None = None,
        headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            keeper_redis,
            keeper_file,
            gateways,
            prefer_local,
            local_cluster,
            transport,
            timeout_s,
            refresh_s,
            backoff_s,
            max_backoff_s,
            seed,
            clock,
        )
        self.retries, self.retry_delay_s = retries, retry_delay_s
        if transport == "http":
            self._transport: SyncTransport = HttpTransport(timeout_s, headers)
        elif transport == "grpc":
            self._transport = GrpcTransport(timeout_s, headers)
        else:
            self._transport = transport

    def refresh(self) -> list[ClusterInfo]:
        """Re-read the registry now; returns the clusters."""
        if self.keeper_redis is not None or self.keeper_file is not None:
            self._apply(self._read())
        return self.clusters

    def _attempt(
        self, pipeline: str, n_events: int, call: Callable[[ClusterInfo], Any]
    ) -> tuple[Any, ClusterInfo]:
        if self._due():
            self.refresh()
        errors: list[tuple[str, Unavailable]] = []
        for round_ in range(self.retries + 1):
            if round_:
                if all(e.status == 404 for _, e in errors):
                    break
                time.sleep(self._round_delay(round_))
            for cluster in self._order(pipeline):
                started = self._clock()
                try:
                    result = call(cluster)
                except Unavailable as exc:
                    self._router.failed(cluster, started, exc)
                    errors.append((cluster.name, exc))
                    continue
                self._router.succeeded(cluster, started, n_events)
                return result, cluster
        raise self._exhausted(pipeline, errors)

    def publish(
        self,
        pipeline: str,
        events: Any,
        *,
        type: str = "eventbus.client",
        source: str = "/eventbus/client",
    ) -> Accepted:
        """Send events to a pipeline; returns once one cluster's broker accepted them all.

        Args:
            pipeline: the pipeline's name (it needs an ``http`` or ``grpc`` source).
            events: a :class:`CloudEvent`, a list of them, or any other value as the data of
                one new event (with ``type`` and ``source``).
            type: the type of an event made from data.
            source: the source of an event made from data.

        Returns:
            The accepted ids (a list) with ``.cluster``, the cluster that accepted them.

        Raises:
            IngressError: refused (4xx, the message names pipeline, cluster and status), or no
                cluster answered (503; nothing is known to be accepted: retry with the same events).
        """
        evs = _as_events(events, type, source)
        ids, cluster = self._attempt(
            pipeline, len(evs), lambda c: self._transport.publish(c, pipeline, evs)
        )
        return Accepted(ids, cluster.name)

    def invoke(
        self,
        pipeline: str,
        event: Any,
        *,
        type: str = "eventbus.client",
        source: str = "/eventbus/client",
    ) -> list[CloudEvent]:
        """Run one event through a pipeline and return its outputs (none when filtered out).

        Raises:
            IngressError: refused (4xx; 422 when a step failed) or no cluster answered (503).
        """
        ev = _one_event(event, type, source)
        outputs, _ = self._attempt(pipeline, 1, lambda c: self._transport.invoke(c, pipeline, ev))
        return outputs  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close the connections."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_BaseClient):
    """The asyncio variant of :class:`Client` (same arguments; ``await`` every call).

    Example:
        >>> async with eventbus.AsyncClient(keeper_redis="redis://127.0.0.1:6379/0") as client:  # doctest: +SKIP
        ...     ids = await client.publish("orders", {"amount": 5})
    """

    def __init__(
        self,
        keeper_redis: str | None = None,
        *,
        keeper_file: str | Path | None = None,
        gateways: Sequence[str | ClusterInfo | Mapping[str, Any]] | None = None,
        prefer_local: bool = True,
        local_cluster: str | None = None,
        transport: Literal["http", "grpc"] | AsyncTransport = "http",
        timeout_s: float = 10.0,
        refresh_s: float = 5.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        retries: int = 1,
        retry_delay_s: float = 0.2,
        seed: int | None = None,
        headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            keeper_redis,
            keeper_file,
            gateways,
            prefer_local,
            local_cluster,
            transport,
            timeout_s,
            refresh_s,
            backoff_s,
            max_backoff_s,
            seed,
            clock,
        )
        self.retries, self.retry_delay_s = retries, retry_delay_s
        if transport == "http":
            self._transport: AsyncTransport = AsyncHttpTransport(timeout_s, headers)
        elif transport == "grpc":
            self._transport = AsyncGrpcTransport(timeout_s, headers)
        else:
            self._transport = transport
        self._refreshing: asyncio.Task[Any] | None = None

    async def refresh(self) -> list[ClusterInfo]:
        """Re-read the registry now (in a worker thread); returns the clusters."""
        if self.keeper_redis is not None or self.keeper_file is not None:
            self._apply(await asyncio.to_thread(self._read))
        return self.clusters

    async def _attempt(
        self, pipeline: str, n_events: int, call: Callable[[ClusterInfo], Any]
    ) -> tuple[Any, ClusterInfo]:
        if self._due():
            # Concurrent requests share one read of the registry.
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.ensure_future(self.refresh())
            await asyncio.shield(self._refreshing)
        errors: list[tuple[str, Unavailable]] = []
        for round_ in range(self.retries + 1):
            if round_:
                if all(e.status == 404 for _, e in errors):
                    break
                await asyncio.sleep(self._round_delay(round_))
            for cluster in self._order(pipeline):
                started = self._clock()
                try:
                    result = await call(cluster)
                except Unavailable as exc:
                    self._router.failed(cluster, started, exc)
                    errors.append((cluster.name, exc))
                    continue
                self._router.succeeded(cluster, started, n_events)
                return result, cluster
        raise self._exhausted(pipeline, errors)

    async def publish(
        self,
        pipeline: str,
        events: Any,
        *,
        type: str = "eventbus.client",
        source: str = "/eventbus/client",
    ) -> Accepted:
        """See :meth:`Client.publish`."""
        evs = _as_events(events, type, source)
        ids, cluster = await self._attempt(
            pipeline, len(evs), lambda c: self._transport.publish(c, pipeline, evs)
        )
        return Accepted(ids, cluster.name)

    async def invoke(
        self,
        pipeline: str,
        event: Any,
        *,
        type: str = "eventbus.client",
        source: str = "/eventbus/client",
    ) -> list[CloudEvent]:
        """See :meth:`Client.invoke`."""
        ev = _one_event(event, type, source)
        outputs, _ = await self._attempt(
            pipeline, 1, lambda c: self._transport.invoke(c, pipeline, ev)
        )
        return outputs  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Close the connections."""
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
