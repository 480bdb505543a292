"""The gateway's read side of observability: pipelines' figures from Redis, on request.

:class:`Observer` reads ``eventbus:pipelines`` and ``eventbus:stats:<name>`` (asyncio Redis)
and serves ``/metrics``, ``/v1/stats``, ``/v1/pipelines/{name}/stats`` and the dashboard.
"""

from __future__ import annotations

import json
from typing import Any

from eventbus.observability._metrics import GatewayMetrics
from eventbus.observability._prometheus import render_prometheus
from eventbus.observability._view import pipeline_view

__all__ = ["Observer"]

_PIPELINES_KEY = "eventbus:pipelines"
_STATS_KEY = "eventbus:stats:{pipeline}"


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
        raw = await self.redis.hgetall(_STATS_KEY.format(pipeline=record["name"]))
        view = pipeline_view(record, list(raw.values()), self._consumed_topics(record))
        if self.gateway is not None:
            view["gateway"] = self.gateway.for_pipeline(record["name"])
        return view

    async def view(self, name: str) -> dict[str, Any] | None:
        """One pipeline's figures, or None when no pipeline of that name is deployed."""
        raw = await self.redis.hget(_PIPELINES_KEY, name)
        if raw is None:
            return None
        return await self._view(json.loads(raw))

    async def views(self) -> list[dict[str, Any]]:
        """Every deployed pipeline's figures, by name."""
        records = [json.loads(v) for v in (await self.redis.hgetall(_PIPELINES_KEY)).values()]
        return [await self._view(r) for r in sorted(records, key=lambda r: r["name"])]

    async def metrics(self) -> bytes:
        """The Prometheus text exposition of every pipeline and of this gateway."""
        return render_prometheus(await self.views(), self.gateway)
