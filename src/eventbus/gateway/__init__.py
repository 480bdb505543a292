"""The gateway: HTTP and gRPC ingress, caller auth, the admin API and the dashboard.

``eventbus gateway`` (started by ``eventbus up``; one per node of a cluster) runs a
:class:`Gateway`: uvicorn + FastAPI (:func:`build_http_app`) and grpc.aio
(:func:`build_grpc_server`) on one event loop, in front of the pipelines' ``http`` and
``grpc`` sources. A request goes through the transport-independent :class:`Ingress` (route,
auth, decode, validate) to the :class:`GatewayBackend`, which micro-batches it
(:class:`MicroBatcher`) into one Kafka produce to the pipeline's ingress topic (async) or one
Ray Serve call (sync). Routes come from the pipelines the controller keeps in Redis. The same
app serves the admin REST API (:func:`add_admin_routes`) and the figures and dashboard
(:class:`Observer`).

Importing this package imports FastAPI and grpc, not Ray.
"""

from __future__ import annotations

from eventbus.gateway._admin import add_admin_routes, admin_token_from
from eventbus.gateway._auth import Credentials, authenticate, load_credentials
from eventbus.gateway._backend import GatewayBackend
from eventbus.gateway._batcher import MicroBatcher
from eventbus.gateway._grpc import build_grpc_server, grpc_status
from eventbus.gateway._http import build_http_app
from eventbus.gateway._ingress import Ingress, IngressBackend, split_outcomes
from eventbus.gateway._observer import Observer, add_observability_routes
from eventbus.gateway._routes import Route, RouteTable
from eventbus.gateway._server import Gateway, run_gateway

__all__ = [
    "Credentials",
    "Gateway",
    "GatewayBackend",
    "Ingress",
    "IngressBackend",
    "MicroBatcher",
    "Observer",
    "Route",
    "RouteTable",
    "add_admin_routes",
    "add_observability_routes",
    "admin_token_from",
    "authenticate",
    "build_grpc_server",
    "build_http_app",
    "grpc_status",
    "load_credentials",
    "run_gateway",
    "split_outcomes",
]
