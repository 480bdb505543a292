"""The gateway's routes: which pipelines (and HTTP paths) take events over ``http`` or
``grpc``, each with its source settings resolved (credentials read, data schema compiled), and
the 404 naming what is served when a request names something else."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eventbus.errors import ConfigError, IngressError
from eventbus.eventing.sources._http_config import GrpcSourceConfig, HttpSourceConfig
from eventbus.gateway._auth import Credentials, index_tokens, load_credentials

__all__ = ["Route", "RouteTable"]

log = logging.getLogger("eventbus.gateway")


@dataclass
class Route:
    """One pipeline's ``http`` or ``grpc`` source, resolved (secret read, schema compiled)."""

    pipeline: str
    kind: str
    config: HttpSourceConfig | GrpcSourceConfig
    credentials: Credentials | None = None
    validator: Any = None
    problem: str | None = None  # why the route cannot serve (e.g. its secret is missing)

    @property
    def default_source(self) -> str:
        return self.config.source or f"/eventbus/{self.pipeline}"


@dataclass
class RouteTable:
    """Pipelines and paths the gateway serves.

    Build it with :meth:`from_documents` from the deployed pipeline documents.
    """

    http: dict[str, Route] = field(default_factory=dict)
    paths: dict[str, Route] = field(default_factory=dict)
    grpc: dict[str, Route] = field(default_factory=dict)
    pipelines: frozenset[str] = frozenset()
    #: bearer token digest -> the pipelines it opens (to tell 403 from 401 in O(1))
    token_owners: dict[bytes, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def from_documents(
        cls,
        documents: Iterable[dict[str, Any]],
        environ: Mapping[str, str] | None = None,
        secrets: Mapping[str, bytes] | None = None,
    ) -> RouteTable:
        """Routes of every pipeline document (invalid documents are skipped and logged);
        ``secrets``: the stack's secrets by name, for ``{secret: NAME}`` references."""
        from eventbus.pipelines._config import PipelineConfig

        table = cls()
        names = set()
        for doc in documents:
            try:
                config = PipelineConfig.model_validate(doc)
            except ValueError:
                log.exception("skipping an invalid pipeline document")
                continue
            names.add(config.name)
            for src in config.spec.sources:
                if src.http is not None:
                    route = _resolve(config.name, "http", src.http, environ, secrets)
                    table.http.setdefault(config.name, route)
                    if src.http.path is not None:
                        table.paths.setdefault(src.http.path, route)
                elif src.grpc is not None:
                    table.grpc[config.name] = _resolve(
                        config.name, "grpc", src.grpc, environ, secrets
                    )
        table.pipelines = frozenset(names)
        routes = (*table.http.values(), *table.paths.values(), *table.grpc.values())
        table.token_owners = index_tokens(r.credentials for r in routes if r.credentials)
        return table

    def _missing(self, name: str, kind: str, served: Iterable[str]) -> IngressError:
        if name in self.pipelines:
            example = "- http: {}" if kind == "http" else "- grpc: {}"
            return IngressError(
                404,
                f"pipeline {name!r} has no {kind} source; add '{example}' to its sources and redeploy",
            )
        listed = ", ".join(sorted(served)) or "none"
        return IngressError(
            404,
            f"no pipeline named {name!r} accepts {kind} events (those that do: {listed}); `eventbus list` shows the deployed pipelines",
        )

    def http_route(self, pipeline: str) -> Route:
        """The route of ``POST /v1/pipelines/{pipeline}/events``.

        Raises:
            IngressError: 404 naming the pipeline.
        """
        route = self.http.get(pipeline)
        if route is None:
            raise self._missing(pipeline, "http", self.http)
        return route

    def path_route(self, path: str) -> Route:
        """The route of a source's ``path:``.

        Raises:
            IngressError: 404 naming the path.
        """
        route = self.paths.get(path.rstrip("/") or "/")
        if route is None:
            listed = ", ".join(sorted(self.paths)) or "none"
            raise IngressError(
                404,
                f"no pipeline serves path {path!r} (paths served: {listed}; or POST /v1/pipelines/<name>/events)",
            )
        return route

    def grpc_route(self, pipeline: str) -> Route:
        """The route of a gRPC call naming ``pipeline``.

        Raises:
            IngressError: 404 naming the pipeline.
        """
        route = self.grpc.get(pipeline)
        if route is None:
            raise self._missing(pipeline, "grpc", self.grpc)
        return route


def _resolve(
    pipeline: str,
    kind: str,
    config: HttpSourceConfig | GrpcSourceConfig,
    environ: Mapping[str, str] | None,
    secrets: Mapping[str, bytes] | None = None,
) -> Route:
    route = Route(pipeline, kind, config)
    try:
        route.credentials = load_credentials(pipeline, config.auth, environ, secrets)
    except ConfigError as e:
        route.problem = str(e)
        log.error("%s", e)
    if config.data_schema is not None:
        from eventbus.eventing.sources._data_schema import data_validator

        route.validator = data_validator(config.data_schema)
    return route
