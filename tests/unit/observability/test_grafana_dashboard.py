"""``deploy/grafana/eventbus-pipelines.json`` asks only for what the exporter really exports.

The exporter's output here is real: :func:`render_prometheus` over a view merged by
:func:`pipeline_view` from replica entries that fill every metric family, parsed back with
prometheus_client's parser. Every PromQL expression of the dashboard (panel targets and
template variables) must name at least one metric, each one a sample name of that output,
and filter and group only by labels those metrics carry.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventbus.observability._metrics import (
    BATCH_SIZE_BOUNDS,
    LATENCY_BOUNDS_S,
    GatewayMetrics,
    Histogram,
)
from eventbus.observability._prometheus import render_prometheus
from eventbus.observability._view import _TOTALS, pipeline_view

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "eventbus-pipelines.json"
_METRIC = re.compile(r"\beventbus_[a-zA-Z0-9_]+")
_SELECTOR = re.compile(r"(eventbus_[a-zA-Z0-9_]+)\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\(\s*(eventbus_[a-zA-Z0-9_]+)\s*,\s*(\w+)\s*\)")


def _exported() -> dict[str, set[str]]:
    """Sample name -> its label names, of one scrape of a pipeline that has every figure."""
    lat = Histogram(LATENCY_BOUNDS_S)
    lat.observe(0.004, count=10)
    batch = Histogram(BATCH_SIZE_BOUNDS)
    batch.observe(10)
    counters = dict.fromkeys(_TOTALS, 1)  # every source counter the view sums
    step = {"template": "join", "in": 3, "out": 2, "filtered": 1, "failed": 0, "batches": 1}
    entry = {
        "at": 1000.0,
        "final": False,
        "sources": [counters],
        "metrics": {
            "sources": [{"latency": lat.snapshot(), "lag": {"orders[0]": 4}}],
            "steps": {
                "pair": {**step, "seconds": 0.01, "stats": {"pending_keys": 2}},
                "score": {**step, "template": "model", "stats": {"model_version": "3"}},
            },
            "batch_size": batch.snapshot(),
            "batch_seconds": lat.snapshot(),
        },
    }
    record = {"name": "orders", "version": 2, "document": {"spec": {}}}
    scale = {"since": 990.0, "last_event_at": 980.0}
    view = pipeline_view(record, [json.dumps(entry)], [["orders"]], now=1000.0, scale=scale)
    gateway = GatewayMetrics()
    gateway.observe("orders", "sync", 200, 0.01, events=1)
    text = render_prometheus([view], gateway).decode()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def _expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query template variable."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            out.append(
                (f"variable {var['name']!r}", query["query"] if isinstance(query, dict) else query)
            )
    return out


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    return _exported()


def test_every_expression_names_metrics_the_exporter_exports(dashboard, exported) -> None:
    expressions = _expressions(dashboard)
    assert len(expressions) >= 20
    for where, expr in expressions:
        names = set(_METRIC.findall(expr))
        assert names, f"{where}: {expr!r} names no eventbus metric"
        unknown = sorted(names - set(exported))
        assert not unknown, f"{where}: {unknown} are not exported (exported: {sorted(exported)})"


def test_every_label_an_expression_uses_is_on_its_metrics(dashboard, exported) -> None:
    for where, expr in _expressions(dashboard):
        metrics = set(_METRIC.findall(expr))
        carried = set().union(*(exported[m] for m in metrics))
        for metric, matchers in _SELECTOR.findall(expr):
            for label in _MATCHER.findall(matchers):
                assert label in exported[metric], f"{where}: {metric} has no label {label!r}"
        for group in _BY.findall(expr):
            for label in (g.strip() for g in group.split(",") if g.strip()):
                assert label in carried, f"{where}: no metric of {expr!r} has label {label!r}"
        for metric, label in _LABEL_VALUES.findall(expr):
            assert label in exported[metric], f"{where}: {metric} has no label {label!r}"


def test_the_dashboard_imports_cleanly(dashboard) -> None:
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "pipeline"} <= names
    for p in panels:
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"] and len({t["refId"] for t in p["targets"]}) == len(p["targets"])
            for t in p["targets"]:
                assert '{pipeline=~"$pipeline"}' in t["expr"], (p["title"], t["expr"])


def test_a_misspelt_metric_would_be_caught(exported) -> None:
    # the check itself: a name the exporter does not have is reported, with the suffixes
    # Prometheus adds (counters _total, histograms _bucket/_sum/_count, info _info)
    assert "eventbus_events_in_total" in exported and "eventbus_events_in" not in exported
    assert "eventbus_end_to_end_latency_seconds_bucket" in exported
    assert "eventbus_model_info" in exported
    assert {"pipeline", "topic", "partition"} <= exported["eventbus_consumer_lag"]
