"""What :class:`~eventbus.Client` and :class:`~eventbus.AsyncClient` share: the arguments,
the registry refresh, the order of clusters and the errors once every cluster failed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from eventbus._client._registry import ClusterInfo, read_registry
from eventbus._client._router import ClientStats, Unavailable, _Router
from eventbus._internal.backoff import Backoff
from eventbus.errors import ConfigError, IngressError
from eventbus.eventing._event import CloudEvent

log = logging.getLogger("eventbus.client")


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
