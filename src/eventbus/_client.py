"""The EventBus client: publish and invoke at the gateways of one or several clusters.

A keeper (``eventbus keeper``, :class:`eventbus.serving._keeper.Keeper`) records the clusters
in a registry: a JSON document in the Redis key ``eventbus:keeper:clusters`` (or a file). The
client reads it (again every ``refresh_s``), sends each request to one cluster (the local one
when its weight is above 0, otherwise one drawn by weight) and, when that cluster does not
answer (connection error, timeout, 5xx), marks it down for a backoff period and sends the same
events, ids unchanged, to the next cluster. Only a 202 (HTTP) or an OK ``Publish`` (gRPC)
counts as accepted. This module imports neither Ray nor gRPC (gRPC only when used).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import quote

from eventbus._internal import keys
from eventbus._internal.backoff import Backoff
from eventbus.errors import ConfigError, IngressError
from eventbus.eventing._event import CloudEvent

__all__ = [
    "KEEPER_KEY",
    "Accepted",
    "AsyncClient",
    "Client",
    "ClientStats",
    "ClusterInfo",
    "ClusterStats",
    "Unavailable",
    "dump_registry",
    "parse_registry",
    "read_registry",
]

log = logging.getLogger("eventbus.client")

#: The Redis key of the keeper's registry (one JSON document).
#: The keeper registry's Redis key (see :mod:`eventbus._internal.keys`).
KEEPER_KEY = keys.KEEPER_CLUSTERS
PIPELINE_METADATA = "x-eventbus-pipeline"
#: The random part of a failed cluster's mark-down period (0.5: 50-100 % of it).
MARK_DOWN_JITTER = 0.5


# -- the registry -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterInfo:
    """One cluster as the keeper records it.

    Attributes:
        name: the cluster's name (``[a-z0-9_-]``), unique in the registry.
        gateway: the HTTP base URL of its gateway (``http://host:8080``).
        grpc: ``host:port`` of its gateway's gRPC service.
        ray_address: its Ray address (for deploys; the client never uses it).
        kafka: its Kafka bootstrap servers (for deploys).
        redis: its Redis URL (for deploys).
        home: an ``EVENTBUS_HOME`` whose ``stack.json`` describes it (for deploys).
        ray_token_file: the Ray auth token file of the cluster (a path on the keeper's host).
        kafka_config: its Kafka connection settings file (``--kafka-config``: TLS, SASL; secrets
            by reference), a path on the keeper's host, for deploys.
        weight: relative share of the traffic (0: none unless every other cluster is down).
        local: clients prefer this cluster while its weight is above 0.
    """

    name: str
    gateway: str | None = None
    grpc: str | None = None
    ray_address: str | None = None
    kafka: str | None = None
    redis: str | None = None
    home: str | None = None
    ray_token_file: str | None = None
    kafka_config: str | None = None
    weight: int = 100
    local: bool = False

    def __post_init__(self) -> None:
        if not self.name or not all(ch.isalnum() or ch in "-_" for ch in self.name):
            msg = f"cluster name {self.name!r} must be letters, digits, '-' or '_'"
            raise ConfigError(msg)
        if not isinstance(self.weight, int) or isinstance(self.weight, bool) or self.weight < 0:
            msg = f"cluster {self.name!r}: weight must be an integer >= 0; got {self.weight!r}"
            raise ConfigError(msg)
        if self.gateway is not None and not self.gateway.startswith(("http://", "https://")):
            msg = f"cluster {self.name!r}: gateway must be an http:// or https:// URL; got {self.gateway!r}"
            raise ConfigError(msg)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> ClusterInfo:
        """Build from a registry entry; unknown keys (a newer keeper's) are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in known})


def parse_registry(raw: str | bytes) -> list[ClusterInfo]:
    """The clusters of a registry document (``{"version": 1, "clusters": [...]}``).

    Raises:
        ConfigError: the document is not a registry.
    """
    try:
        doc = json.loads(raw)
        return [ClusterInfo.from_dict(c) for c in doc["clusters"]]
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"the keeper registry is not a valid document ({type(exc).__name__}: {exc}); rewrite it with `eventbus keeper add`"
        raise ConfigError(msg) from None


def dump_registry(clusters: Iterable[ClusterInfo]) -> str:
    """The registry document of ``clusters``."""
    return json.dumps(
        {"version": 1, "updated": time.time(), "clusters": [asdict(c) for c in clusters]}, indent=2
    )


def read_registry(
    *, keeper_redis: str | None = None, keeper_file: str | Path | None = None
) -> list[ClusterInfo]:
    """Read the keeper's registry from Redis (key :data:`KEEPER_KEY`) or from a file.

    Returns an empty list when nothing was registered yet.
    """
    if keeper_redis is not None:
        from eventbus._internal.redis_client import connect

        r = connect(keeper_redis, socket_timeout=2.0, socket_connect_timeout=2.0)
        try:
            raw = r.get(KEEPER_KEY)
        finally:
            r.close()
        return [] if raw is None else parse_registry(raw)
    if keeper_file is not None:
        path = Path(keeper_file)
        return parse_registry(path.read_bytes()) if path.exists() else []
    return []


# -- routing: weights, local preference, backoff, failover timing -----------------------------


@dataclass
class ClusterStats:
    """Counters of one cluster as this client saw it."""

    requests: int = 0
    failures: int = 0
    events_accepted: int = 0
    down_until: float = 0.0


@dataclass
class ClientStats:
    """What the client did: per-cluster counters and the failovers it measured.

    Attributes:
        clusters: name -> :class:`ClusterStats`.
        failovers: failovers completed (a request failed on one cluster, then one succeeded
            on another).
        failover_s: each failover's time, from the start of the first failed request to the
            end of the first successful one on another cluster sent after the failure was seen.
    """

    clusters: dict[str, ClusterStats] = field(default_factory=dict)
    failovers: int = 0
    failover_s: list[float] = field(default_factory=list)

    @property
    def last_failover_s(self) -> float | None:
        """The most recent failover time, or None."""
        return self.failover_s[-1] if self.failover_s else None


class Unavailable(Exception):
    """A cluster did not take a request; try the next. ``mark_down``: it is unhealthy (not a 404)."""

    def __init__(self, reason: str, *, mark_down: bool = True, status: int = 503) -> None:
        super().__init__(reason, mark_down, status)
        self.reason = reason
        self.mark_down = mark_down
        self.status = status

    def __str__(self) -> str:
        return self.reason


class _Router:
    """Which clusters to try, in order; thread-safe (one lock around tiny critical sections)."""

    def __init__(
        self,
        *,
        prefer_local: bool,
        local_cluster: str | None,
        seed: int | None,
        backoff_s: float,
        max_backoff_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.prefer_local = prefer_local
        self.local_cluster = local_cluster
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.clusters: list[ClusterInfo] = []
        self.stats = ClientStats()
        self._rng = random.Random(seed)
        # A failed cluster is skipped for 50-100 % of its capped, doubling period: clients
        # that saw it fail together do not all come back to it at once.
        self._mark_down = Backoff(backoff_s, max_backoff_s, jitter=MARK_DOWN_JITTER)
        self._failures: dict[str, int] = {}  # failures in a row, per cluster
        self._marked_at: dict[str, float] = {}
        # (cluster that failed, start of the failed request, when it was marked down)
        self._pending: tuple[str, float, float] | None = None
        self._lock = threading.Lock()

    def update(self, clusters: Sequence[ClusterInfo]) -> None:
        with self._lock:
            self.clusters = list(clusters)
            for c in clusters:
                self.stats.clusters.setdefault(c.name, ClusterStats())

    def _is_local(self, c: ClusterInfo) -> bool:
        return c.name == self.local_cluster if self.local_cluster is not None else c.local

    def _weighted_order(self, items: list[ClusterInfo]) -> list[ClusterInfo]:
        out, pool = [], list(items)
        while pool:
            total = sum(c.weight for c in pool)
            x = self._rng.uniform(0, total)
            for i, c in enumerate(pool):
                x -= c.weight
                if x <= 0 or i == len(pool) - 1:
                    out.append(pool.pop(i))
                    break
        return out

    def order(self) -> list[ClusterInfo]:
        """Up clusters with weight > 0 (local first, then drawn by weight), then up clusters
        of weight 0, then the clusters marked down, soonest back first."""
        now = self.clock()
        with self._lock:
            st = self.stats.clusters
            up = [c for c in self.clusters if st[c.name].down_until <= now]
            down = sorted(
                (c for c in self.clusters if st[c.name].down_until > now),
                key=lambda c: st[c.name].down_until,
            )
            weighted = [c for c in up if c.weight > 0]
            local = [c for c in weighted if self.prefer_local and self._is_local(c)]
            rest = [c for c in weighted if c not in local]
            return [
                *self._weighted_order(local),
                *self._weighted_order(rest),
                *(c for c in up if c.weight == 0),
                *down,
            ]

    def failed(self, cluster: ClusterInfo, started: float, exc: Unavailable) -> None:
        with self._lock:
            st = self.stats.clusters.setdefault(cluster.name, ClusterStats())
            st.requests += 1
            st.failures += 1
            if not exc.mark_down:
                return
            now = self.clock()
            # Requests already in flight when the cluster was marked down fail too: they
            # neither lengthen the backoff nor restart it.
            if started < self._marked_at.get(cluster.name, float("-inf")):
                return
            failures = self._failures[cluster.name] = self._failures.get(cluster.name, 0) + 1
            backoff = self._mark_down.delay(failures, self._rng)
            self._marked_at[cluster.name] = now
            st.down_until = now + backoff
            if self._pending is None:
                self._pending = (cluster.name, started, now)
        log.warning(
            "cluster %s did not answer (%s); marked down for %.1f s", cluster.name, exc, backoff
        )

    def succeeded(self, cluster: ClusterInfo, started: float, events: int) -> None:
        now = self.clock()
        with self._lock:
            st = self.stats.clusters.setdefault(cluster.name, ClusterStats())
            st.requests += 1
            st.events_accepted += events
            # A request sent before the cluster was marked down says nothing about it now.
            if started >= self._marked_at.get(cluster.name, float("-inf")):
                st.down_until = 0.0
                self._failures.pop(cluster.name, None)
            # Only a request sent after the failure was seen shows the failover: one already in
            # flight to another cluster would have succeeded anyway.
            if self._pending is not None and started >= self._pending[2]:
                failed, first_started, _ = self._pending
                self._pending = None
                if failed != cluster.name:  # else it recovered before another cluster answered
                    self.stats.failovers += 1
                    self.stats.failover_s.append(now - first_started)

    def snapshot(self) -> ClientStats:
        with self._lock:
            return copy.deepcopy(self.stats)


# -- transports -------------------------------------------------------------------------------


class Accepted(list[str]):
    """The ids of the accepted events (a list), and the cluster that accepted them."""

    def __init__(self, ids: Iterable[str], cluster: str) -> None:
        super().__init__(ids)
        self.cluster = cluster


class SyncTransport(Protocol):
    """How :class:`Client` talks to one cluster; raise :class:`Unavailable` to fail over."""

    def publish(
        self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent]
    ) -> list[str]: ...
    def invoke(
        self, cluster: ClusterInfo, pipeline: str, event: CloudEvent
    ) -> list[CloudEvent]: ...
    def close(self) -> None: ...


class AsyncTransport(Protocol):
    """How :class:`AsyncClient` talks to one cluster; raise :class:`Unavailable` to fail over."""

    async def publish(
        self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent]
    ) -> list[str]: ...
    async def invoke(
        self, cluster: ClusterInfo, pipeline: str, event: CloudEvent
    ) -> list[CloudEvent]: ...
    async def close(self) -> None: ...


def _refused(cluster: ClusterInfo, pipeline: str, status: int, message: str) -> IngressError:
    return IngressError(
        status, f"pipeline {pipeline!r} on cluster {cluster.name!r}: {status}: {message}"
    )


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


# gRPC codes -> (HTTP status, fail over?). Mirrors eventbus.gateway._grpc.
_GRPC_STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 413,
    "FAILED_PRECONDITION": 422,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # A stopped gateway must be retried within seconds once back, not after gRPC's 2-minute cap.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def _grpc_error(cluster: ClusterInfo, pipeline: str, exc: Any) -> Exception:
    code = exc.code().name if exc.code() is not None else "UNKNOWN"
    status = _GRPC_STATUS.get(code, 500)
    if status >= 500:
        return Unavailable(f"gRPC {code}: {exc.details()}", status=status)
    if status == 404:
        return Unavailable(f"gRPC NOT_FOUND: {exc.details()}", mark_down=False, status=404)
    return _refused(cluster, pipeline, status, f"{code}: {exc.details()}")


class _GrpcBase:
    def __init__(self, timeout_s: float, metadata: Mapping[str, str] | None, aio: bool) -> None:
        import grpc

        from eventbus.eventing._proto import eventbus_pb2_grpc

        self._grpc, self._stubs_mod, self._aio = grpc, eventbus_pb2_grpc, aio
        self.timeout_s = timeout_s
        self._metadata = tuple((k.lower(), v) for k, v in (metadata or {}).items())
        # cluster name -> (address, stub, channel); channels of a changed address wait in
        # _stale for close().
        self._channels: dict[str, tuple[str, Any, Any]] = {}
        self._stale: list[Any] = []

    def _stub(self, cluster: ClusterInfo) -> Any:
        if cluster.grpc is None:
            reason = f"cluster {cluster.name!r} has no gRPC address registered"
            raise Unavailable(reason, mark_down=False)
        got = self._channels.get(cluster.name)
        if got is None or got[0] != cluster.grpc:
            if got is not None:
                self._stale.append(got[2])
            factory = self._grpc.aio.insecure_channel if self._aio else self._grpc.insecure_channel
            channel = factory(cluster.grpc, options=_GRPC_OPTIONS)
            got = (cluster.grpc, self._stubs_mod.EventBusStub(channel), channel)  # type: ignore[no-untyped-call]
            self._channels[cluster.name] = got
        return got[1]

    def _all_channels(self) -> list[Any]:
        channels = [got[2] for got in self._channels.values()] + self._stale
        self._channels.clear()
        self._stale.clear()
        return channels

    def _meta(self, pipeline: str) -> tuple[tuple[str, str], ...]:
        return ((PIPELINE_METADATA, pipeline), *self._metadata)


class GrpcTransport(_GrpcBase):
    """gRPC (``eventbus.v1.EventBus``) to the gateways, one channel per cluster."""

    def __init__(self, timeout_s: float, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(timeout_s, metadata, aio=False)

    def publish(self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent]) -> list[str]:
        from eventbus.eventing._protobuf import events_to_proto_batch

        try:
            self._stub(cluster).Publish(
                events_to_proto_batch(events), metadata=self._meta(pipeline), timeout=self.timeout_s
            )
        except self._grpc.RpcError as exc:
            raise _grpc_error(cluster, pipeline, exc) from None
        return [e.attributes["id"] for e in events]

    def invoke(self, cluster: ClusterInfo, pipeline: str, event: CloudEvent) -> list[CloudEvent]:
        from eventbus.eventing._protobuf import event_to_proto, events_from_proto_batch

        try:
            reply = self._stub(cluster).Invoke(
                event_to_proto(event), metadata=self._meta(pipeline), timeout=self.timeout_s
            )
        except self._grpc.RpcError as exc:
            raise _grpc_error(cluster, pipeline, exc) from None
        return events_from_proto_batch(reply)

    def close(self) -> None:
        for channel in self._all_channels():
            channel.close()


class AsyncGrpcTransport(_GrpcBase):
    """gRPC (``grpc.aio``) to the gateways, one channel per cluster."""

    def __init__(self, timeout_s: float, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(timeout_s, metadata, aio=True)

    async def publish(
        self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent]
    ) -> list[str]:
        from eventbus.eventing._protobuf import events_to_proto_batch

        try:
            await self._stub(cluster).Publish(
                events_to_proto_batch(events), metadata=self._meta(pipeline), timeout=self.timeout_s
            )
        except self._grpc.RpcError as exc:
            raise _grpc_error(cluster, pipeline, exc) from None
        return [e.attributes["id"] for e in events]

    async def invoke(
        self, cluster: ClusterInfo, pipeline: str, event: CloudEvent
    ) -> list[CloudEvent]:
        from eventbus.eventing._protobuf import event_to_proto, events_from_proto_batch

        try:
            reply = await self._stub(cluster).Invoke(
                event_to_proto(event), metadata=self._meta(pipeline), timeout=self.timeout_s
            )
        except self._grpc.RpcError as exc:
            raise _grpc_error(cluster, pipeline, exc) from None
        return events_from_proto_batch(reply)

    async def close(self) -> None:
        for channel in self._all_channels():
            await channel.close()


# -- the clients ------------------------------------------------------------------------------


def _as_events(events: Any, type_: str, source: str) -> list[CloudEvent]:
    if isinstance(events, CloudEvent):
        return [events]
    if (
        isinstance(events, (list, tuple))
        and events
        and all(isinstance(e, CloudEvent) for e in events)
    ):
        return list(events)
    if isinstance(events, (list, tuple)) and (
        not events or any(isinstance(e, CloudEvent) for e in events)
    ):
        msg = f"give a CloudEvent, a non-empty list of CloudEvents, or the data of one event; got {type(events).__name__} of {len(events)} items that are not all CloudEvents"
        raise ConfigError(msg)
    return [CloudEvent.create(type=type_, source=source, data=events)]


def _one_event(event: Any, type_: str, source: str) -> CloudEvent:
    if isinstance(event, (list, tuple)) and event and isinstance(event[0], CloudEvent):
        msg = f"invoke takes one event; got a list of {len(event)}: call invoke once per event"
        raise ConfigError(msg)
    return _as_events(event, type_, source)[0]


def _static_clusters(
    gateways: Sequence[str | ClusterInfo | Mapping[str, Any]],
) -> list[ClusterInfo]:
    out = []
    for i, g in enumerate(gateways):
        if isinstance(g, ClusterInfo):
            out.append(g)
        elif isinstance(g, Mapping):
            out.append(ClusterInfo.from_dict({"name": f"c{i}", **g}))
        elif g.startswith(("http://", "https://")):
            out.append(ClusterInfo(name=f"c{i}", gateway=g))
        else:
            out.append(ClusterInfo(name=f"c{i}", grpc=g))
    return out


class _BaseClient:
    retries: int
    retry_delay_s: float

    def __init__(
        self,
        keeper_redis: str | None,
        keeper_file: str | Path | None,
        gateways: Sequence[str | ClusterInfo | Mapping[str, Any]] | None,
        prefer_local: bool,
        local_cluster: str | None,
        transport: Any,
        timeout_s: float,
        refresh_s: float,
        backoff_s: float,
        max_backoff_s: float,
        seed: int | None,
        clock: Callable[[], float],
    ) -> None:
        if sum(x is not None for x in (keeper_redis, keeper_file, gateways)) != 1:
            msg = "give exactly one of keeper_redis= (the keeper's Redis URL), keeper_file= or gateways= (a list of gateway URLs)"
            raise ConfigError(msg)
        if isinstance(transport, str) and transport not in ("http", "grpc"):
            msg = f"transport must be 'http' or 'grpc'; got {transport!r}"
            raise ConfigError(msg)
        self.keeper_redis, self.keeper_file = keeper_redis, keeper_file
        self.timeout_s, self.refresh_s = timeout_s, refresh_s
        self._clock = clock
        self._router = _Router(
            prefer_local=prefer_local,
            local_cluster=local_cluster,
            seed=seed,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            clock=clock,
        )
        self._refreshed_at: float | None = None
        if gateways is not None:
            self._router.update(_static_clusters(gateways))
            self._refreshed_at = float("inf")

    @property
    def clusters(self) -> list[ClusterInfo]:
        """The clusters as last read from the registry."""
        return list(self._router.clusters)

    def stats(self) -> ClientStats:
        """A snapshot of the per-cluster counters and the measured failover times."""
        return self._router.snapshot()

    def _round_delay(self, round_: int) -> float:
        """The pause before extra round ``round_`` (1, 2, ...) over every cluster."""
        first = self.retry_delay_s
        return Backoff(first, max(first, self._router.max_backoff_s)).delay(round_)

    def _due(self) -> bool:
        return self._refreshed_at is None or self._clock() - self._refreshed_at >= self.refresh_s

    def _apply(self, clusters: list[ClusterInfo] | BaseException) -> None:
        self._refreshed_at = self._clock()
        if isinstance(clusters, BaseException):
            if not self._router.clusters:
                where = self.keeper_redis or self.keeper_file
                msg = f"cannot read the keeper registry at {where}: {clusters}; is it reachable?"
                raise IngressError(503, msg) from clusters
            log.warning(
                "keeping the last known clusters: cannot read the keeper registry: %s", clusters
            )
            return
        self._router.update(clusters)

    def _read(self) -> list[ClusterInfo] | BaseException:
        try:
            return read_registry(keeper_redis=self.keeper_redis, keeper_file=self.keeper_file)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the last registry
            return exc

    def _order(self, pipeline: str) -> list[ClusterInfo]:
        order = self._router.order()
        if not order:
            msg = f"pipeline {pipeline!r}: no clusters are registered; add one with `eventbus keeper add` or pass gateways="
            raise IngressError(503, msg)
        return order

    @staticmethod
    def _exhausted(pipeline: str, errors: list[tuple[str, Unavailable]]) -> IngressError:
        tried = "; ".join(dict.fromkeys(f"{name}: {e}" for name, e in errors))
        if all(e.status == 404 for _, e in errors):
            return IngressError(404, f"pipeline {pipeline!r}: not found on any cluster ({tried})")
        return IngressError(
            503,
            f"pipeline {pipeline!r}: no cluster took the request ({tried}); retry: events keep their ids",
        )


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
