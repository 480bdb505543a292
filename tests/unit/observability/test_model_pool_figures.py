"""A model step's pool figures and its model's shadow experiment in the view, ``eventbus
status`` and ``/metrics``."""

from __future__ import annotations

import io
import json

from rich.console import Console

from eventbus.observability import pipeline_view
from eventbus.observability._metrics import GatewayMetrics
from eventbus.observability._prometheus import render_prometheus
from eventbus.observability._terminal import print_figures
from tests.unit.observability.test_metrics import _entry


def test_pool_figures_are_taken_once_not_summed_over_pipeline_replicas() -> None:
    record = {"name": "p", "version": 1, "document": {"spec": {"steps": []}}}
    raws = []
    for calls in (3, 4):  # two pipeline replicas calling the same pool
        entry = json.loads(_entry(10.0))
        entry["metrics"]["steps"] = {
            "score": {
                "template": "model",
                "in": 5,
                "out": 5,
                "stats": {
                    "rows": 5,
                    "calls": calls,
                    "pool": "fraud",
                    "pool_loads": 9,
                    "pool_evictions": 5,
                    "pool_failed_loads": 1,
                    "pool_models": 4,
                },
            }
        }
        raws.append(json.dumps(entry))
    v = pipeline_view(record, raws, now=11.0)
    assert v["model_pools"] == {
        "score": {"pool": "fraud", "loads": 9, "evictions": 5, "failed_loads": 1, "models": 4}
    }
    assert v["steps"]["score"]["stats"]["calls"] == 7  # the step's own counters are summed
    buf = io.StringIO()
    print_figures(Console(file=buf, width=200), v)
    assert "model pool fraud (step score): 4 models held, 9 loads, 5 evictions, 1 failed loads" in (
        buf.getvalue()
    )
    text = render_prometheus([v], GatewayMetrics()).decode()
    assert 'eventbus_model_pool_evictions{pipeline="p",pool="fraud",step="score"} 5.0' in text
    assert 'eventbus_model_pool_loads{pipeline="p",pool="fraud",step="score"} 9.0' in text


def test_shadow_figures_in_the_view_status_and_metrics() -> None:
    record = {"name": "p", "version": 1, "document": {"spec": {"steps": []}}}
    entry = json.loads(_entry(10.0))
    shadow = {
        "model": "fraud",
        "version": 3,
        "share": 0.2,
        "rows": 120,
        "agreement": 0.975,
        "mad": float("nan"),  # a replica's odd figure: unknown, not exported
        "errors": 0,
        "dropped_rows": 4,
        "live_p99_ms": 2.5,
        "candidate_p99_ms": None,
    }
    entry["metrics"]["steps"] = {
        "score": {"template": "model", "in": 5, "out": 5, "stats": {"rows": 5, "shadow": shadow}},
        "other": {"template": "model", "in": 1, "out": 1, "stats": {"shadow": "junk"}},
    }
    v = pipeline_view(record, [json.dumps(entry)], now=11.0)
    assert list(v["model_shadows"]) == ["score"]
    sh = v["model_shadows"]["score"]
    assert sh["agreement"] == 0.975 and sh["mad"] is None and sh["version"] == 3
    buf = io.StringIO()
    print_figures(Console(file=buf, width=300), v)
    assert (
        "model fraud (step score): shadow version 3 (20% mirrored): 120 rows compared, "
        "agreement 97.5%, 0 errors, 4 rows dropped"
    ) in buf.getvalue()
    text = render_prometheus([v], GatewayMetrics()).decode()
    labels = 'model="fraud",pipeline="p",step="score",version="3"'
    assert f"eventbus_model_shadow_agreement{{{labels}}} 0.975" in text
    assert f"eventbus_model_shadow_dropped_rows{{{labels}}} 4.0" in text
    assert "eventbus_model_shadow_mad{" not in text
    assert "eventbus_model_shadow_candidate_p99_ms{" not in text
