"""Prometheus exposition of the pipelines' figures (the gateway's ``GET /metrics``).

A custom collector over already-merged views (:func:`~eventbus.observability._view.pipeline_view`)
and the gateway's own :class:`GatewayMetrics`: the replicas' counters reach Prometheus through
Redis and any gateway, so one scrape of one gateway sees every pipeline. Ray's own metrics
export (``ray.util.metrics``) needs Ray's metrics agent, which the embedded stack does not
start (``include_dashboard=False``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from eventbus.observability._metrics import GatewayMetrics
from eventbus.observability._model_figures import POOL_FIGURES, SHADOW_FIGURES

__all__ = ["CONTENT_TYPE", "render_prometheus"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: source counter -> (metric name, help)
_SOURCE_COUNTERS = {
    "consumed": (
        "eventbus_events_in",
        "Events consumed by the pipeline's sources (records, decodable or not).",
    ),
    "outputs": (
        "eventbus_events_out",
        "Events delivered to the sink (with routes: (event, sink) deliveries).",
    ),
    "unrouted": (
        "eventbus_events_unrouted",
        "Outputs no route took (the pipeline has routes and no default route).",
    ),
    "dropped": (
        "eventbus_events_dropped",
        "Input events that produced no output (filtered, absorbed, or dropped on an error).",
    ),
    "failed": ("eventbus_events_failed", "Input events that failed (after retries)."),
    "dead_lettered": ("eventbus_dead_letters", "Events written to the dead-letter sink."),
    "decode_errors": ("eventbus_decode_errors", "Records that did not decode as CloudEvents."),
    "committed": ("eventbus_events_committed", "Records whose offsets were committed."),
    "duplicates": ("eventbus_duplicates_suppressed", "Outputs dropped by dedupe."),
    "retries": ("eventbus_retries", "Re-dispatches of failed events by the retry policy."),
    "poison": (
        "eventbus_poison_events",
        "Events set aside (dead-lettered) because their batch failed the same way every retry.",
    ),
    "too_large": (
        "eventbus_events_too_large",
        "Inputs dead-lettered because an output was larger than the sink or broker accepts.",
    ),
    "dead_letters_truncated": (
        "eventbus_dead_letters_truncated",
        "Dead letters written cut short (too large whole; ebtruncated and ebsize record it).",
    ),
    "dead_letters_lost": (
        "eventbus_dead_letters_lost",
        "Dead letters the dead-letter sink refused even cut short (logged with their ids).",
    ),
    "revoke_timeouts": (
        "eventbus_revoke_timeouts",
        "Rebalances whose drain outlasted revoke_timeout_s (uncommitted events are redelivered).",
    ),
}
_STEP_COUNTERS = {
    "in": ("eventbus_step_events_in", "Events that entered the step."),
    "out": ("eventbus_step_events_out", "Events the step output."),
    "filtered": ("eventbus_step_events_filtered", "Inputs the step's predicate dropped."),
    "absorbed": (
        "eventbus_step_events_absorbed",
        "Inputs held in the step's state (a join waiting, an aggregate's window).",
    ),
    "errors": ("eventbus_step_events_errors", "Inputs whose expression or function failed."),
    "late": ("eventbus_step_events_late", "Inputs that came after their window closed."),
    "emitted": (
        "eventbus_step_events_emitted",
        "Events the step's timer emitted (closed windows, outer-join results).",
    ),
    "batches": ("eventbus_step_batches", "Batches the step ran."),
    "seconds": ("eventbus_step_seconds", "Time spent in the step."),
}
#: the pipeline's totals as ``eventbus status`` and the dashboard show them
_PIPELINE_COUNTERS = {
    "in": ("eventbus_pipeline_events_in", "Events that came in (sources and sync calls)."),
    "out": (
        "eventbus_pipeline_events_out",
        "Events delivered to the sinks, closed windows included.",
    ),
    "filtered": ("eventbus_pipeline_events_filtered", "Inputs a step's predicate dropped."),
    "absorbed": (
        "eventbus_pipeline_events_absorbed",
        "Inputs held in a step's state (a join waiting, an aggregate's window).",
    ),
    "errors": (
        "eventbus_pipeline_events_errors",
        "Inputs whose expression or function failed in a step.",
    ),
    "late": ("eventbus_pipeline_events_late", "Inputs that came after their window closed."),
    "emitted": (
        "eventbus_pipeline_events_emitted",
        "Events the steps' timers emitted (closed windows, outer-join results).",
    ),
}


def _histogram(family: Any, labels: list[str], snap: dict[str, Any]) -> None:
    cumulative = 0
    buckets = []
    for bound, count in zip([*snap["bounds"], float("inf")], snap["counts"]):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
    family.add_metric(labels, buckets, snap["sum"])


class _Collector:
    def __init__(self, views: Iterable[dict[str, Any]], gateway: GatewayMetrics | None) -> None:
        self.views = list(views)
        self.gateway = gateway

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            InfoMetricFamily,
        )

        sources = {
            k: CounterMetricFamily(n, h, labels=["pipeline", "source"])
            for k, (n, h) in _SOURCE_COUNTERS.items()
        }
        steps = {
            k: CounterMetricFamily(n, h, labels=["pipeline", "step", "template"])
            for k, (n, h) in _STEP_COUNTERS.items()
        }
        totals = {
            k: CounterMetricFamily(n, h, labels=["pipeline"])
            for k, (n, h) in _PIPELINE_COUNTERS.items()
        }
        latency = HistogramMetricFamily(
            "eventbus_end_to_end_latency_seconds",
            "From the record's timestamp (ingress) to the sink's ack, per delivered batch weighed by its events.",
            labels=["pipeline", "source"],
        )
        batch = HistogramMetricFamily(
            "eventbus_batch_size", "Events per batch run by the replicas.", labels=["pipeline"]
        )
        batch_s = HistogramMetricFamily(
            "eventbus_batch_seconds", "Time to run a batch through every step.", labels=["pipeline"]
        )
        lag = GaugeMetricFamily(
            "eventbus_consumer_lag",
            "Log end (latest fetch's high watermark) minus committed offset.",
            labels=["pipeline", "topic", "partition"],
        )
        join = GaugeMetricFamily(
            "eventbus_join_state_keys",
            "Keys waiting in a join step's state.",
            labels=["pipeline", "step"],
        )
        agg = {
            k: GaugeMetricFamily(f"eventbus_aggregate_{k}", help_, labels=["pipeline", "step"])
            for k, help_ in (
                ("open_windows", "Windows an aggregate step holds open."),
                ("state_bytes", "Bytes of an aggregate step's window state in Redis."),
                ("late_events", "Events an aggregate step dead-lettered as late (live replicas)."),
            )
        }
        replicas = GaugeMetricFamily(
            "eventbus_replicas", "Replicas publishing figures (live).", labels=["pipeline"]
        )
        version = GaugeMetricFamily(
            "eventbus_pipeline_version",
            "The deployed version of the pipeline.",
            labels=["pipeline"],
        )
        models = InfoMetricFamily(
            "eventbus_model", "The model version a step serves.", labels=["pipeline", "step"]
        )
        pools = {
            k: GaugeMetricFamily(
                f"eventbus_model_pool_{k}",
                f"{_POOL_HELP[k]}, as the pool's replicas last told the model step calling it.",
                labels=["pipeline", "step", "pool"],
            )
            for k in POOL_FIGURES
        }
        shadows = {
            k: GaugeMetricFamily(
                f"eventbus_model_shadow_{k}",
                f"{_SHADOW_HELP[k]}, as the model's replicas last told the step calling it.",
                labels=["pipeline", "step", "model", "version"],
            )
            for k in SHADOW_FIGURES
        }
        zero = GaugeMetricFamily(
            "eventbus_pipeline_scaled_to_zero",
            "1 while the pipeline's replicas are scaled to zero (replicas.min: 0, idle).",
            labels=["pipeline"],
        )
        last_event = GaugeMetricFamily(
            "eventbus_pipeline_last_event_timestamp_seconds",
            "When the pipeline last had an event in (Unix time).",
            labels=["pipeline"],
        )
        for v in self.views:
            p = v["name"]
            replicas.add_metric([p], v["replicas"])
            zero.add_metric([p], 1 if v.get("state") == "SCALED_TO_ZERO" else 0)
            if v.get("last_event_at") is not None:
                last_event.add_metric([p], v["last_event_at"])
            if v.get("version") is not None:
                version.add_metric([p], v["version"])
            for i, s in enumerate(v["sources"]):
                src = ",".join(s.get("topics") or []) or str(i)
                for k, fam in sources.items():
                    fam.add_metric([p, src], s["counters"].get(k, 0))
                if s.get("latency"):
                    _histogram(latency, [p, src], s["latency"])
            sync = v.get("sync") or {}
            if any(sync.values()):  # sync calls through the gateways: source "sync"
                for k, n in sync.items():
                    sources[k].add_metric([p, "sync"], n)
            for k, fam in totals.items():
                fam.add_metric([p], v["totals"].get(k, 0))
            for sid, st in v["steps"].items():
                for k, fam in steps.items():
                    fam.add_metric([p, sid, st.get("template", "")], st.get(k, 0))
            if v["batch_size"]["histogram"]:
                _histogram(batch, [p], v["batch_size"]["histogram"])
            if v.get("batch_seconds"):
                _histogram(batch_s, [p], v["batch_seconds"])
            for part, n in v["lag"].items():
                topic, _, rest = part.rpartition("[")
                lag.add_metric([p, topic, rest.rstrip("]")], n)
            for sid, n in v["join_state"].items():
                join.add_metric([p, sid], n)
            for sid, figures in v.get("aggregate_state", {}).items():
                for k, gauge in agg.items():
                    gauge.add_metric([p, sid], figures.get(k, 0))
            for sid, ver in v["models"].items():
                models.add_metric([p, sid], {"version": ver})
            for sid, figures in v.get("model_pools", {}).items():
                for k, gauge in pools.items():
                    gauge.add_metric([p, sid, str(figures["pool"])], figures[k])
            for sid, sh in v.get("model_shadows", {}).items():
                labels = [p, sid, sh["model"], str(sh["version"])]
                for k, gauge in shadows.items():
                    if sh.get(k) is not None:
                        gauge.add_metric(labels, sh[k])
        yield from sources.values()
        yield from totals.values()
        yield from steps.values()
        yield from agg.values()
        yield from pools.values()
        yield from shadows.values()
        yield from (latency, batch, batch_s, lag, join, replicas, version, models, zero, last_event)
        if self.gateway is not None:
            snap = self.gateway.snapshot()
            req = CounterMetricFamily(
                "eventbus_gateway_requests",
                "Requests the gateway answered.",
                labels=["pipeline", "mode", "status"],
            )
            for r in snap["requests"]:
                req.add_metric([r["pipeline"], r["mode"], str(r["status"])], r["count"])
            ev = CounterMetricFamily(
                "eventbus_gateway_events",
                "Events accepted (async) or run (sync) by the gateway.",
                labels=["pipeline", "mode"],
            )
            for r in snap["events"]:
                ev.add_metric([r["pipeline"], r["mode"]], r["count"])
            lat = HistogramMetricFamily(
                "eventbus_gateway_request_seconds",
                "Gateway request latency.",
                labels=["pipeline", "mode"],
            )
            for r in snap["latency"]:
                _histogram(lat, [r["pipeline"], r["mode"]], r["histogram"])
            yield from (req, ev, lat)


_POOL_HELP = {
    "loads": "Models a model pool's replicas loaded since they started",
    "evictions": "Models a model pool's replicas evicted (least recently used) since they started",
    "failed_loads": "Model loads that failed in a model pool (no such model, a bad artifact)",
    "models": "Models a model pool's replicas hold now",
}
_SHADOW_HELP = {
    "rows": "Rows a shadow version was compared on",
    "agreement": "Share of compared rows whose label the shadow version gives too",
    "mad": "Mean absolute difference of the shadow version's float outputs",
    "errors": "Mirrored calls the shadow version raised on",
    "dropped_rows": "Mirrored rows dropped (the in-flight bound was reached), not compared",
    "live_p99_ms": "p99 of the served version's forward passes in the experiment, in ms",
    "candidate_p99_ms": "p99 of the shadow version's forward passes, in ms",
}


def render_prometheus(
    views: Iterable[dict[str, Any]], gateway: GatewayMetrics | None = None
) -> bytes:
    """The text exposition format of the pipelines' views and the gateway's figures.

    Args:
        views: one :func:`pipeline_view` per pipeline.
        gateway: the gateway's own figures (None: left out).
    """
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(views, gateway))
    return generate_latest(registry)
