"""A model step's pool figures in the view, ``eventbus status`` and ``/metrics``."""

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
