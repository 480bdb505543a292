"""The gateway's read side of observability: pipelines' figures from Redis, on request.

:class:`Observer` reads the pipelines (``eventbus:pipelines``) and their figures
(``eventbus:stats:{<name>}``) with asyncio Redis; :func:`add_observability_routes` serves them
as ``/metrics``, ``/v1/stats``, ``/v1/pipelines/{name}/stats`` and the dashboard page.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response

from eventbus._internal import keys
from eventbus.errors import IngressError
from eventbus.gateway._replies import error_reply, to_response
from eventbus.observability._metrics import GatewayMetrics
from eventbus.observability._prometheus import render_prometheus
from eventbus.observability._view import pipeline_view

__all__ = ["Observer", "add_observability_routes"]

# The page itself belongs to observability; the gateway only serves it.
_DASHBOARD = Path(__file__).resolve().parents[1] / "observability" / "dashboard.html"


class Observer:
    """Builds pipeline views from Redis plus the gateway's own figures.

    Args:
        redis: a ``redis.asyncio`` client (``decode_responses`` either way).
        gateway: the gateway's request figures (None: none).
    """

    def __init__(self, redis: Any, gateway: GatewayMetrics | None = None) -> None:
        self.redis = redis
        self.gateway = gateway
        self._topics: dict[tuple[str, int], list[list[str]]] = {}

    def _consumed_topics(self, record: dict[str, Any]) -> list[list[str]]:
        key = (record["name"], int(record.get("version") or 0))
        topics = self._topics.get(key)
        if topics is None:
            from eventbus.pipelines._config import PipelineConfig

            config = PipelineConfig.model_validate(record["document"])
            topics = self._topics[key] = [list(s.topics) for s in config.consumed_sources]
        return topics

    async def _view(self, record: dict[str, Any]) -> dict[str, Any]:
        raw = await self.redis.hgetall(keys.stats(record["name"]))
        scale = await self.redis.hget(keys.SCALED_TO_ZERO, record["name"])
        view = pipeline_view(
            record,
            list(raw.values()),
            self._consumed_topics(record),
            scale=json.loads(scale) if scale else None,
        )
        if self.gateway is not None:
            view["gateway"] = self.gateway.for_pipeline(record["name"])
        return view

    async def view(self, name: str) -> dict[str, Any] | None:
        """One pipeline's figures, or None when no pipeline of that name is deployed."""
        raw = await self.redis.hget(keys.PIPELINES, name)
        if raw is None:
            return None
        return await self._view(json.loads(raw))

    async def views(self) -> list[dict[str, Any]]:
        """Every deployed pipeline's figures, by name."""
        records = [json.loads(v) for v in (await self.redis.hgetall(keys.PIPELINES)).values()]
        return [await self._view(r) for r in sorted(records, key=lambda r: r["name"])]

    async def metrics(self) -> bytes:
        """The Prometheus text exposition of every pipeline and of this gateway."""
        return render_prometheus(await self.views(), self.gateway)


def add_observability_routes(app: FastAPI, observer: Observer) -> None:
    """Serve ``/metrics``, ``/v1/stats``, ``/v1/pipelines/{name}/stats`` and ``/dashboard``.

    Args:
        app: the gateway's application.
        observer: where the figures come from.
    """
    from eventbus.observability._prometheus import CONTENT_TYPE

    @app.get("/metrics", summary="Prometheus metrics of every pipeline and of this gateway")
    async def metrics() -> Response:
        return Response(await observer.metrics(), media_type=CONTENT_TYPE)

    @app.get("/v1/stats", summary="Every pipeline's topology and live figures")
    async def all_stats() -> Response:
        return Response(orjson.dumps(await observer.views()), media_type="application/json")

    @app.get("/v1/pipelines/{name}/stats", summary="A pipeline's topology and live figures")
    async def pipeline_stats(name: str) -> Response:
        view = await observer.view(name)
        if view is None:
            return to_response(
                error_reply(
                    IngressError(
                        404, f"no pipeline named {name!r} is deployed; GET /v1/stats lists them"
                    )
                )
            )
        return Response(orjson.dumps(view), media_type="application/json")

    @app.get("/dashboard", summary="The web dashboard", include_in_schema=False)
    async def dashboard() -> Response:
        return Response(_DASHBOARD.read_bytes(), media_type="text/html; charset=utf-8")
