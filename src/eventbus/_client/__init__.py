"""The EventBus client: publish and invoke at the gateways of one or several clusters.

A keeper (``eventbus keeper``, :class:`eventbus.serving._keeper.Keeper`) records the clusters
in a registry: a JSON document in the Redis key ``eventbus:keeper:clusters`` (or a file). The
client reads it (again every ``refresh_s``), sends each request to one cluster (the local one
when its weight is above 0, otherwise one drawn by weight) and, when that cluster does not
answer (connection error, timeout, 5xx), marks it down for a backoff period and sends the same
events, ids unchanged, to the next cluster. Only a 202 (HTTP) or an OK ``Publish`` (gRPC)
counts as accepted. This package imports neither Ray nor gRPC (gRPC only when used).

The parts: ``_registry`` (:class:`ClusterInfo`, the registry document), ``_router`` (which
cluster next: weights, local preference, mark-downs, :class:`ClientStats`), ``_transport``
(the transport contract), ``_http`` and ``_grpc`` (the transports, sync and async), ``_base``
(what both clients share) and ``_clients`` (:class:`Client`, :class:`AsyncClient`).
"""

from eventbus._client._clients import AsyncClient, Client
from eventbus._client._registry import (
    KEEPER_KEY,
    ClusterInfo,
    dump_registry,
    parse_registry,
    read_registry,
)
from eventbus._client._router import ClientStats, ClusterStats, Unavailable
from eventbus._client._transport import Accepted

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
