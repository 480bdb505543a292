"""What a transport is: how a client talks to one cluster, and what it answers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from eventbus._client._registry import ClusterInfo
from eventbus.errors import IngressError
from eventbus.eventing._event import CloudEvent

__all__ = ["Accepted", "AsyncTransport", "SyncTransport"]


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
