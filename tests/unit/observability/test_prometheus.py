"""The /metrics exposition: parsed back with prometheus_client's own parser."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from eventbus.observability import GatewayMetrics, Histogram, pipeline_view, render_prometheus
from eventbus.observability._metrics import LATENCY_BOUNDS_S


def view() -> dict:
    h = Histogram(LATENCY_BOUNDS_S)
    h.observe(0.004, 30)
    h.observe(0.2, 10)
    entry = {
        "at": 100.0,
        "final": False,
        "sources": [
            {
                "consumed": 40,
                "outputs": 25,
                "dropped": 10,
                "failed": 5,
                "dead_lettered": 5,
                "poison": 2,
                "too_large": 1,
                "dead_letters_truncated": 1,
                "revoke_timeouts": 3,
                "unrouted": 4,
            }
        ],
        "metrics": {
            "steps": {
                "large": {
                    "template": "filter",
                    "in": 40,
                    "out": 30,
                    "filtered": 8,
                    "absorbed": 0,
                    "errors": 2,
                    "late": 0,
                    "emitted": 0,
                    "batches": 2,
                    "seconds": 0.5,
                    "stats": {"pending_keys": 3, "model_version": "2"},
                }
            },
            "batch_size": {"bounds": [10, 100], "counts": [0, 2, 0], "count": 2, "sum": 40},
            "batch_seconds": {"bounds": [1.0], "counts": [2, 0], "count": 2, "sum": 0.5},
            "sources": [{"latency": h.snapshot(), "lag": {"orders[0]": 12, "orders[1]": 3}}],
        },
    }
    record = {
        "name": "orders",
        "version": 4,
        "document": {
            "spec": {
                "sources": [{"kafka": {"topic": "orders"}}],
                "steps": [{"id": "large", "filter": "x"}],
                "sink": {"kafka": {"topic": "o"}},
            }
        },
    }
    return pipeline_view(record, [json.dumps(entry)], [["orders"]], now=101.0)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_cover_pipelines_steps_histograms_lag_and_gateway() -> None:
    g = GatewayMetrics()
    g.observe("orders", "sync", 200, 0.01, events=1)
    text = render_prometheus([view()], g).decode()
    s = samples(text)
    src = (("pipeline", "orders"), ("source", "orders"))
    assert s[("eventbus_events_in_total", src)] == 40
    assert s[("eventbus_events_out_total", src)] == 25
    assert s[("eventbus_events_dropped_total", src)] == 10
    assert s[("eventbus_events_failed_total", src)] == 5
    assert s[("eventbus_dead_letters_total", src)] == 5
    # what was set aside is counted with its reason, never silently
    assert s[("eventbus_poison_events_total", src)] == 2
    assert s[("eventbus_events_too_large_total", src)] == 1
    assert s[("eventbus_dead_letters_truncated_total", src)] == 1
    assert s[("eventbus_dead_letters_lost_total", src)] == 0
    assert s[("eventbus_revoke_timeouts_total", src)] == 3
    assert s[("eventbus_events_unrouted_total", src)] == 4
    step = (("pipeline", "orders"), ("step", "large"), ("template", "filter"))
    assert s[("eventbus_step_events_in_total", step)] == 40
    assert s[("eventbus_step_events_filtered_total", step)] == 8
    assert s[("eventbus_step_events_errors_total", step)] == 2
    assert s[("eventbus_step_events_absorbed_total", step)] == 0
    # the pipeline's totals under the names `eventbus status` and the dashboard show
    pipe = (("pipeline", "orders"),)
    assert s[("eventbus_pipeline_events_in_total", pipe)] == 40
    assert s[("eventbus_pipeline_events_out_total", pipe)] == 25
    assert s[("eventbus_pipeline_events_filtered_total", pipe)] == 8
    assert s[("eventbus_pipeline_events_errors_total", pipe)] == 2
    assert s[("eventbus_pipeline_events_late_total", pipe)] == 0
    assert s[("eventbus_end_to_end_latency_seconds_count", src)] == 40
    assert s[("eventbus_end_to_end_latency_seconds_bucket", (("le", "0.005"), *src))] == 30
    assert s[("eventbus_end_to_end_latency_seconds_bucket", (("le", "+Inf"), *src))] == 40
    assert s[("eventbus_batch_size_sum", (("pipeline", "orders"),))] == 40
    assert (
        s[
            (
                "eventbus_consumer_lag",
                (("partition", "0"), ("pipeline", "orders"), ("topic", "orders")),
            )
        ]
        == 12
    )
    assert s[("eventbus_join_state_keys", (("pipeline", "orders"), ("step", "large")))] == 3
    assert (
        s[("eventbus_model_info", (("pipeline", "orders"), ("step", "large"), ("version", "2")))]
        == 1
    )
    assert s[("eventbus_pipeline_version", (("pipeline", "orders"),))] == 4
    assert s[("eventbus_replicas", (("pipeline", "orders"),))] == 1
    assert (
        s[
            (
                "eventbus_gateway_requests_total",
                (("mode", "sync"), ("pipeline", "orders"), ("status", "200")),
            )
        ]
        == 1
    )
    assert (
        s[("eventbus_gateway_request_seconds_count", (("mode", "sync"), ("pipeline", "orders")))]
        == 1
    )


def test_no_pipelines_gives_a_valid_empty_exposition() -> None:
    assert samples(render_prometheus([]).decode()) == {}


def test_gateway_sync_calls_are_a_source_sync_series() -> None:
    record = {
        "name": "orders",
        "version": 4,
        "document": {
            "spec": {
                "sources": [{"kafka": {"topic": "orders"}}],
                "steps": [],
                "sink": {"kafka": {"topic": "o"}},
            }
        },
    }
    gw = {
        "at": 100.0,
        "final": False,
        "role": "gateway",
        "sync": {"consumed": 3, "outputs": 2, "dropped": 0, "failed": 1},
    }
    v = pipeline_view(record, [json.dumps(gw)], [["orders"]], now=101.0)
    s = samples(render_prometheus([v]).decode())
    assert s[("eventbus_events_in_total", (("pipeline", "orders"), ("source", "sync")))] == 3
    assert s[("eventbus_events_failed_total", (("pipeline", "orders"), ("source", "sync")))] == 1
    assert s[("eventbus_events_in_total", (("pipeline", "orders"), ("source", "orders")))] == 0
    assert s[("eventbus_replicas", (("pipeline", "orders"),))] == 0


def test_metrics_carry_aggregate_windows_state_and_late_events() -> None:
    v = view()
    v["aggregate_state"] = {"per_user": {"open_windows": 7, "state_bytes": 2048, "late_events": 3}}
    s = samples(render_prometheus([v], GatewayMetrics()).decode())
    labels = (("pipeline", "orders"), ("step", "per_user"))
    assert s[("eventbus_aggregate_open_windows", labels)] == 7
    assert s[("eventbus_aggregate_state_bytes", labels)] == 2048
    assert s[("eventbus_aggregate_late_events", labels)] == 3
