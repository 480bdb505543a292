"""What the controller answers about pipelines (read-only): ``list`` and ``status``."""

from __future__ import annotations

import json
from typing import Any

import ray

from eventbus._internal import keys
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._host import serving_app
from eventbus.serving._source_actors import NAMESPACE, source_actor_name

__all__ = ["pipeline_list", "pipeline_status"]


def pipeline_list(redis: Any) -> list[dict[str, Any]]:
    """Every deployed pipeline: name, version, deploy time, Serve status (or
    ``SCALED_TO_ZERO``), sources and steps, by name."""
    from ray import serve

    from eventbus.serving._scale_to_zero import SCALED_TO_ZERO

    statuses: dict[str, str] = {}
    try:
        for app, st in serve.status().applications.items():
            statuses[app] = str(st.status.value if hasattr(st.status, "value") else st.status)
    except Exception:  # noqa: BLE001, S110 - Serve not started yet
        pass
    zero = redis.hgetall(keys.SCALED_TO_ZERO)
    degraded = redis.hgetall(keys.DEGRADED)
    out = []
    for raw in redis.hgetall(keys.PIPELINES).values():
        rec = json.loads(raw)
        status = statuses.get(serving_app(rec["document"]), "MISSING")
        if status == "RUNNING" and rec["name"] in degraded:
            status = "DEGRADED"  # a topic of it is gone (see _topic_checks)
        out.append(
            {
                "name": rec["name"],
                "version": rec["version"],
                "deployed_at": rec["deployed_at"],
                # at zero Serve says RUNNING (zero of zero replicas): not failed, idle
                "status": SCALED_TO_ZERO if rec["name"] in zero else status,
                "sources": len(rec["document"]["spec"]["sources"]),
                "steps": len(rec["document"]["spec"].get("steps", [])),
            }
        )
    return sorted(out, key=lambda r: r["name"])


def pipeline_status(
    redis: Any, record: dict[str, Any], scale: dict[str, Any] | None
) -> dict[str, Any]:
    """A pipeline's live figures from its stored ``record``: source counters (published by
    its replicas, or asked of its source actors), the merged view, and ``scale``, its
    scaled-to-zero entry (None: it runs)."""
    from eventbus.observability._view import mark_degraded, mark_refused_logins, pipeline_view

    name = record["name"]
    config = PipelineConfig.model_validate(record["document"])
    sources: list[dict[str, Any]]
    if config.spec.serving.source_placement == "replica":
        from eventbus.serving._replica_figures import read_stats

        sources = read_stats(redis, name, len(config.consumed_sources))
    else:
        sources = []
        for i in range(len(config.consumed_sources)):
            try:
                # Any: SourceActor's methods are not @ray.method (no typed `.remote`).
                actor: Any = ray.get_actor(source_actor_name(name, i), namespace=NAMESPACE)
                sources.append(ray.get(actor.stats.remote(), timeout=10))
            except Exception as exc:  # noqa: BLE001
                sources.append({"error": f"{type(exc).__name__}: {exc}"})
    raw = list(redis.hgetall(keys.stats(name)).values())
    figures = pipeline_view(
        record, raw, [list(s.topics) for s in config.consumed_sources], scale=scale
    )
    mark_degraded(figures, redis.hget(keys.DEGRADED, name))
    mark_refused_logins(figures, sources, name)
    return {
        "name": name,
        "version": record["version"],
        "state": figures["state"],
        "sources": sources,
        "figures": figures,
    }
