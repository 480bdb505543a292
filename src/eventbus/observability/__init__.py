"""Observability: per-step counters and histograms, Prometheus metrics, traces, JSON logs.

Replicas keep counters per batch (:class:`StepCounters`, :class:`Histogram`) and publish them
to Redis; the gateway merges them (:func:`pipeline_view`) into ``/metrics``
(:func:`render_prometheus`), the dashboard's JSON and ``eventbus status``. Traces follow the
CloudEvents ``traceparent`` extension (:func:`configure_tracing`); logs can be JSON lines
(:class:`JsonFormatter`). Importing this package imports neither prometheus_client nor
OpenTelemetry.
"""

from __future__ import annotations

from eventbus.observability._logging import JsonFormatter, configure_json_logging
from eventbus.observability._metrics import (
    GatewayMetrics,
    Histogram,
    StepCounters,
    merge_histograms,
    quantile,
)
from eventbus.observability._prometheus import render_prometheus
from eventbus.observability._tracing import TracedSink, configure_tracing, shutdown_tracing, tracer
from eventbus.observability._view import pipeline_view, topology

__all__ = [
    "GatewayMetrics",
    "Histogram",
    "JsonFormatter",
    "StepCounters",
    "TracedSink",
    "configure_json_logging",
    "configure_tracing",
    "merge_histograms",
    "pipeline_view",
    "quantile",
    "render_prometheus",
    "shutdown_tracing",
    "topology",
    "tracer",
]
