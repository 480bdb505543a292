"""The gateway's read side of observability: pipelines' figures from Redis, on request.

:class:`Observer` reads the pipelines (``eventbus:pipelines``), their figures
(``eventbus:stats:{<name>}``) and their 15-minute history (``eventbus:history:{<name>}:*``)
with asyncio Redis; :func:`add_observability_routes` serves them as ``/metrics``,
``/v1/stats``, ``/v1/pipelines/{name}/stats``, ``/v1/history``,
``/v1/pipelines/{name}/history`` and the dashboard page.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from eventbus._internal import keys
from eventbus.errors import IngressError
from eventbus.gateway._replies import error_reply, to_response
from eventbus.observability._history import (
    BUCKET_S,
    WINDOW_S,
    history_columns,
    read_rows,
    settled_starts,
)
from eventbus.observability._metrics import GatewayMetrics
from eventbus.observability._prometheus import render_prometheus
from eventbus.observability._view import mark_degraded, pipeline_view

__all__ = ["Observer", "add_observability_routes"]

# The page itself belongs to observability; the gateway only serves it.
_DASHBOARD = Path(__file__).resolve().parents[1] / "observability" / "dashboard.html"
#: A pipeline's history is read from Redis at most this often (readers in between share it):
#: its buckets settle every 10 s, and a page polls every few seconds.
_HISTORY_CACHE_S = 2.0
_HISTORY_PARAMS = ("window_s",)
#: History reads from Redis at once (the first read of a pipeline fetches all its buckets:
#: with many pipelines, a few at a time keep the loop and the Redis connections free).
_HISTORY_READS = 2


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
        self._history: dict[str, tuple[float, asyncio.Future[dict[str, Any]]]] = {}
        #: pipeline -> (its deploy time, settled bucket start -> row): settled buckets do
        #: not change, so each is read from Redis once, and a poll reads only the new ones
        self._rows: dict[str, tuple[Any, dict[int, list[int]]]] = {}
        self._reads = asyncio.Semaphore(_HISTORY_READS)

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
        mark_degraded(view, await self.redis.hget(keys.DEGRADED, record["name"]))
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

    async def _read_history(self, name: str, deployed: Any) -> dict[str, Any]:
        now = time.time()
        starts = settled_starts(now)
        cached = self._rows.get(name)
        rows = cached[1] if cached is not None and cached[0] == deployed else {}
        missing = [t for t in starts if t not in rows]
        if missing:
            async with self._reads:  # a cold read of many pipelines: a few at a time
                rows.update(zip(missing, await read_rows(self.redis, name, missing)))
        for t in [t for t in rows if t < starts[0]]:
            del rows[t]
        self._rows[name] = (deployed, rows)
        return history_columns([(t, rows[t]) for t in starts], now)

    async def _full_history(self, name: str, deployed: Any) -> dict[str, Any]:
        now = time.monotonic()
        hit = self._history.get(name)
        if (
            hit is None
            or now - hit[0] >= _HISTORY_CACHE_S
            or (hit[1].done() and hit[1].exception() is not None)
        ):
            task = asyncio.ensure_future(self._read_history(name, deployed))
            hit = self._history[name] = (now, task)
        return await asyncio.shield(hit[1])

    async def history(self, name: str, window_s: int = WINDOW_S) -> dict[str, Any] | None:
        """A pipeline's last ``window_s`` seconds (``observability._history`` columns, with
        ``name``), or None when no pipeline of that name is deployed."""
        raw = await self.redis.hget(keys.PIPELINES, name)
        if raw is None:
            return None
        deployed = json.loads(raw).get("deployed_at")
        return {"name": name, **_window(await self._full_history(name, deployed), window_s)}

    async def histories(self, window_s: int = WINDOW_S) -> list[dict[str, Any]]:
        """Every deployed pipeline's history, by name."""
        records = await self.redis.hgetall(keys.PIPELINES)
        names = sorted(records)
        for gone in set(self._history) - set(names):
            del self._history[gone]
        for gone in set(self._rows) - set(names):
            del self._rows[gone]
        full = await asyncio.gather(
            *(self._full_history(n, json.loads(records[n]).get("deployed_at")) for n in names)
        )
        return [{"name": n, **_window(h, window_s)} for n, h in zip(names, full)]

    async def metrics(self) -> bytes:
        """The Prometheus text exposition of every pipeline and of this gateway."""
        return render_prometheus(await self.views(), self.gateway)


def _window(full: dict[str, Any], window_s: int) -> dict[str, Any]:
    """The last ``window_s`` seconds of a full history."""
    n = window_s // BUCKET_S
    return {
        k: (v[-n:] if isinstance(v, list) else v) for k, v in full.items() if k != "window_s"
    } | {"window_s": n * BUCKET_S}


def history_window(request: Request) -> int:
    """The ``window_s`` query parameter of a history request (default: all 15 minutes).

    Raises:
        IngressError: 400 naming the parameter, the value and what is accepted.
    """
    items = request.query_params.multi_items()
    for k, _ in items:
        if k not in _HISTORY_PARAMS:
            shown = k if len(k) <= 40 else k[:40] + "..."
            msg = f"unknown query parameter {shown!r}; {request.url.path} takes window_s only"
            raise IngressError(400, msg)
    values = [v for _, v in items]
    if not values:
        return WINDOW_S
    if len(values) > 1:
        raise IngressError(400, f"window_s is given {len(values)} times; give it once")
    raw = values[0]
    shown = raw if len(raw) <= 40 else raw[:40] + "..."
    fix = f"give whole seconds from {BUCKET_S} to {WINDOW_S} (e.g. window_s=300)"
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
        raise IngressError(400, f"window_s {shown!r} is not a whole number of seconds; {fix}")
    window_s = int(raw)
    if not BUCKET_S <= window_s <= WINDOW_S:
        raise IngressError(400, f"window_s {window_s} is out of range; {fix}")
    return window_s


def add_observability_routes(app: FastAPI, observer: Observer) -> None:
    """Serve ``/metrics``, ``/v1/stats``, ``/v1/pipelines/{name}/stats``, ``/v1/history``,
    ``/v1/pipelines/{name}/history`` and ``/dashboard``.

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
            return to_response(error_reply(_not_deployed(name)))
        return Response(orjson.dumps(view), media_type="application/json")

    @app.get("/v1/history", summary="Every pipeline's last 15 minutes, in 10 s buckets")
    async def all_history(request: Request) -> Response:
        try:
            window_s = history_window(request)
        except IngressError as e:
            return to_response(error_reply(e))
        return Response(orjson.dumps(await observer.histories(window_s)), media_type=_JSON)

    @app.get("/v1/pipelines/{name}/history", summary="A pipeline's last 15 minutes")
    async def pipeline_history(name: str, request: Request) -> Response:
        try:
            window_s = history_window(request)
        except IngressError as e:
            return to_response(error_reply(e))
        history = await observer.history(name, window_s)
        if history is None:
            return to_response(error_reply(_not_deployed(name)))
        return Response(orjson.dumps(history), media_type=_JSON)

    @app.get("/dashboard", summary="The web dashboard", include_in_schema=False)
    async def dashboard() -> Response:
        return Response(_DASHBOARD.read_bytes(), media_type="text/html; charset=utf-8")


_JSON = "application/json"


def _not_deployed(name: str) -> IngressError:
    shown = name if len(name) <= 80 else name[:80] + "..."
    return IngressError(404, f"no pipeline named {shown!r} is deployed; GET /v1/stats lists them")
