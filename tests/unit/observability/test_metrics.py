"""Counters and histograms: per-step counts of the runner, merging, quantiles, the view."""

from __future__ import annotations

import json

import pytest

from eventbus import CloudEvent
from eventbus.observability import Histogram, merge_histograms, pipeline_view, quantile, topology
from eventbus.observability._metrics import LATENCY_BOUNDS_S, GatewayMetrics
from eventbus.pipelines import PipelineRunner, load_pipeline_text

YAML = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: obs}
spec:
  sources: [{kafka: {topic: in}}, {http: {path: /obs}}]
  steps:
    - id: large
      filter: "data.amount > 100"
    - id: cny
      convert: {set: {"data.cny": "data.amount * 7"}}
  sink: {kafka: {topic: out}}
  dead_letter: {kafka: {topic: dlq}}
"""


def ev(i: int, amount: object) -> CloudEvent:
    return CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"amount": amount})


def runner() -> PipelineRunner:
    return PipelineRunner(load_pipeline_text(YAML, "obs.yaml"))


def test_histogram_buckets_weights_and_quantiles() -> None:
    h = Histogram((1.0, 2.0, 4.0))
    h.observe(0.5, count=50)
    h.observe(3.0, count=50)
    snap = h.snapshot()
    assert snap["counts"] == [50, 0, 50, 0] and snap["count"] == 100
    assert snap["sum"] == pytest.approx(175.0)
    assert quantile(snap, 0.5) == pytest.approx(1.0)  # the top of the first bucket
    assert quantile(snap, 0.99) == pytest.approx(2.0 + 2.0 * 0.98)
    h.observe(100.0)  # +Inf bucket: reported as the highest finite bound
    assert quantile(h.snapshot(), 1.0) == 4.0
    assert quantile(Histogram((1.0,)).snapshot(), 0.5) is None


def test_merge_adds_bucket_by_bucket_and_skips_other_bounds() -> None:
    a, b, other = Histogram((1.0, 2.0)), Histogram((1.0, 2.0)), Histogram((5.0,))
    a.observe(0.5, 3)
    b.observe(1.5, 2)
    other.observe(1.0, 100)
    merged = merge_histograms([a.snapshot(), b.snapshot(), other.snapshot()])
    assert merged is not None
    assert merged["counts"] == [3, 2, 0] and merged["count"] == 5
    assert merge_histograms([]) is None


def test_runner_counts_per_step_in_out_filtered_errors() -> None:
    r = runner()
    # e0 filtered by `large`; e1 passes; e2 fails in `large` (string > int) and is dropped
    # (filters fail closed: an error, not filtered); e3 passes `large` but fails in `cny`
    # (double * int).
    assert r.metrics()["last_event_at"] is None
    r.run([ev(0, 5), ev(1, 500), ev(2, "x"), ev(3, 200.5)])
    r.run([ev(4, 1000)])
    m = r.metrics()
    large, cny = m["steps"]["large"], m["steps"]["cny"]
    assert (large["in"], large["out"], large["filtered"], large["errors"], large["batches"]) == (
        5,
        3,
        1,
        1,
        2,
    )
    assert large["absorbed"] == large["late"] == large["emitted"] == 0
    assert large["template"] == "filter"
    assert (cny["in"], cny["out"], cny["filtered"], cny["errors"]) == (3, 2, 0, 1)
    assert m["last_event_at"] is not None and m["timer_outputs"] == 0
    assert cny["seconds"] > 0
    assert m["batch_size"]["count"] == 2 and m["batch_size"]["sum"] == 5
    assert m["batch_seconds"]["count"] == 2


def _entry(
    at: float,
    *,
    final: bool = False,
    consumed: int = 0,
    outputs: int = 0,
    lag: dict[str, int] | None = None,
    latency_s: float = 0.02,
    step_in: int = 0,
) -> str:
    h = Histogram(LATENCY_BOUNDS_S)
    h.observe(latency_s, consumed)
    steps = {
        "large": {
            "template": "filter",
            "in": step_in,
            "out": step_in // 2,
            "filtered": step_in - step_in // 2,
            "failed": 0,
            "batches": 1,
            "seconds": 0.001,
            "errors": 0,
        }
    }
    return json.dumps(
        {
            "at": at,
            "final": final,
            "sources": [
                {"consumed": consumed, "outputs": outputs, "dead_lettered": 1, "in_flight": 1},
                {"consumed": 0},
            ],
            "metrics": {
                "steps": steps,
                "batch_size": Histogram((10, 100)).snapshot(),
                "batch_seconds": Histogram((1.0,)).snapshot(),
                "sources": [
                    {"latency": h.snapshot(), "lag": lag or {}},
                    {"latency": Histogram(LATENCY_BOUNDS_S).snapshot(), "lag": {}},
                ],
            },
        }
    )


def test_view_sums_live_and_final_replicas_and_skips_dead_ones() -> None:
    record = {
        "name": "obs",
        "version": 3,
        "document": load_pipeline_text(YAML, "obs.yaml").to_document(),
    }
    now = 1000.0
    entries = [
        _entry(now - 1, consumed=100, outputs=40, lag={"in[0]": 7}, latency_s=0.004, step_in=100),
        _entry(now - 500, final=True, consumed=10, outputs=4, latency_s=0.004, step_in=10),
        _entry(now - 60, consumed=1_000_000, outputs=1, lag={"in[1]": 99}),  # died: stale
    ]
    v = pipeline_view(record, entries, [["in"], ["eventbus-ingress-obs"]], now=now)
    assert v["name"] == "obs" and v["version"] == 3 and v["replicas"] == 1
    assert (
        v["totals"]["consumed"] == 110
        and v["totals"]["outputs"] == 44
        and v["totals"]["dead_lettered"] == 2
    )
    assert v["sources"][0]["counters"]["in_flight"] == 1  # a final replica has nothing in flight
    assert v["lag"] == {"in[0]": 7} and v["lag_total"] == 7
    assert v["steps"]["large"]["in"] == 110
    assert 0.0025 < v["latency"]["p50_s"] <= 0.005 and v["latency"]["histogram"]["count"] == 110
    assert [s["kind"] for s in v["topology"]["sources"]] == ["kafka", "http"]
    assert [s["id"] for s in v["topology"]["steps"]] == ["large", "cny"]
    assert (
        v["topology"]["sink"] == {"kind": "kafka", "detail": "out"}
        and v["topology"]["dead_letter"]["detail"] == "dlq"
    )


def test_view_reports_join_state_and_model_versions_from_step_stats() -> None:
    record = {
        "name": "j",
        "version": 1,
        "document": {
            "spec": {
                "sources": [{"kafka": {"topic": "a"}}],
                "steps": [{"id": "m", "model": {"name": "fraud"}}],
                "sink": {"kafka": {"topic": "o"}},
            }
        },
    }
    entry = json.loads(_entry(10.0))
    entry["metrics"]["steps"] = {
        "pair": {
            "template": "join",
            "in": 1,
            "out": 0,
            "filtered": 1,
            "failed": 0,
            "batches": 1,
            "seconds": 0.0,
            "errors": 0,
            "stats": {"pending_keys": 42, "joined": 3},
        },
        "m": {
            "template": "model",
            "in": 1,
            "out": 1,
            "filtered": 0,
            "failed": 0,
            "batches": 1,
            "seconds": 0.0,
            "errors": 0,
            "stats": {"model_version": "v7"},
        },
    }
    v = pipeline_view(record, [json.dumps(entry)], now=11.0)
    assert v["join_state"] == {"pair": 42} and v["models"] == {"m": "v7"}
    assert v["topology"]["steps"] == [{"id": "m", "template": "model", "detail": "fraud"}]


def test_topology_names_step_details() -> None:
    t = topology(load_pipeline_text(YAML, "obs.yaml").to_document())
    assert t["steps"][0] == {"id": "large", "template": "filter", "detail": "data.amount > 100"}
    assert t["sources"][1] == {"kind": "http", "detail": "/obs"}


def test_gateway_metrics_per_pipeline() -> None:
    g = GatewayMetrics()
    for _ in range(99):
        g.observe("p", "sync", 200, 0.003, events=1)
    g.observe("p", "sync", 422, 2.0)
    g.observe("p", "async", 202, 0.001, events=10)
    out = g.for_pipeline("p")
    assert out["sync"]["requests"] == {"200": 99, "422": 1} and out["sync"]["events"] == 99
    assert 0.0025 < out["sync"]["p50_s"] <= 0.005 and out["sync"]["p99_s"] <= 0.005
    assert out["async"]["events"] == 10
    assert g.for_pipeline("other") == {}


def test_view_places_source_actor_entries_and_adds_gateway_sync_calls() -> None:
    """source_placement: actor: each source actor publishes its one source (source_index),
    replicas publish the steps; gateways publish their sync calls, counted in the totals."""
    record = {
        "name": "obs",
        "version": 1,
        "document": load_pipeline_text(YAML, "obs.yaml").to_document(),
    }
    h = Histogram(LATENCY_BOUNDS_S)
    h.observe(0.004, 30)
    actor = {
        "at": 99.0,
        "final": False,
        "role": "source",
        "source_index": 1,
        "sources": [{"consumed": 30, "outputs": 20, "dropped": 10, "in_flight": 2}],
        "metrics": {"sources": [{"latency": h.snapshot(), "lag": {"ingress[0]": 4}}]},
    }
    replica = json.loads(_entry(99.5, step_in=32))
    replica["sources"], replica["metrics"]["sources"] = [], []
    gw = {
        "at": 99.0,
        "final": False,
        "role": "gateway",
        "sync": {"consumed": 2, "outputs": 1, "dropped": 1, "failed": 0},
    }
    gw_old = {
        "at": 10.0,
        "final": True,
        "role": "gateway",
        "sync": {"consumed": 3, "outputs": 0, "dropped": 0, "failed": 3},
    }
    v = pipeline_view(
        record,
        [json.dumps(e) for e in (actor, replica, gw, gw_old)],
        [["in"], ["ingress"]],
        now=100.0,
    )
    assert v["replicas"] == 1  # source actors and gateways are not replicas
    assert v["sources"][0]["counters"] == {} and v["sources"][1]["counters"] == {
        "consumed": 30,
        "outputs": 20,
        "dropped": 10,
        "in_flight": 2,
    }
    assert v["sources"][1]["latency"]["count"] == 30 and v["lag"] == {"ingress[0]": 4}
    assert v["sync"] == {"consumed": 5, "outputs": 1, "dropped": 1, "failed": 3}
    t = v["totals"]
    assert (t["consumed"], t["outputs"], t["dropped"], t["failed"]) == (35, 21, 11, 3)
    assert v["steps"]["large"]["in"] == 32


def test_gateway_counts_the_outcomes_of_sync_batches() -> None:
    from eventbus.eventing._outcome import Failure

    g = GatewayMetrics()
    g.ran("p", [[ev(0, 1), ev(1, 2)], [], Failure("s", "E", "m")])
    g.ran("p", [[ev(2, 3)]])
    g.ran("q", [[]])
    assert g.sync["p"] == {"consumed": 4, "outputs": 3, "dropped": 1, "failed": 1}
    g.forget({"p"})
    assert set(g.sync) == {"p"}


def test_view_reports_aggregate_windows_state_and_late_events() -> None:
    # two replicas share one Redis: its figures are taken once, their counters summed
    record = {"name": "a", "version": 1, "document": {"spec": {"steps": []}}}
    raws = []
    for late in (2, 5):
        entry = json.loads(_entry(10.0))
        entry["metrics"]["steps"] = {
            "per_user": {
                "template": "aggregate",
                "in": 10,
                "out": 0,
                "stats": {
                    "open_windows": 7,
                    "closing_windows": 1,
                    "state_fields": 40,
                    "state_bytes": 2048,
                    "applied_ids": 100,
                    "late_events": late,
                    "windows_emitted": 3,
                },
            }
        }
        raws.append(json.dumps(entry))
    v = pipeline_view(record, raws, now=11.0)
    assert v["aggregate_state"] == {
        "per_user": {"open_windows": 7, "state_bytes": 2048, "late_events": 7}
    }
    stats = v["steps"]["per_user"]["stats"]
    assert stats["applied_ids"] == 100 and stats["windows_emitted"] == 6


def test_status_prints_each_aggregate_step_line() -> None:
    import io

    from rich.console import Console

    from eventbus.observability._terminal import print_figures

    record = {"name": "a", "version": 1, "document": {"spec": {"steps": []}}}
    v = pipeline_view(record, [_entry(10.0)], now=11.0)
    v["aggregate_state"] = {"per_user": {"open_windows": 7, "state_bytes": 2048, "late_events": 3}}
    buf = io.StringIO()
    print_figures(Console(file=buf, width=200), v)
    assert (
        "aggregate per_user: 7 open windows, 2048 bytes of state, 3 late events" in buf.getvalue()
    )


def test_topology_labels_the_new_filter_dialects_and_enrich() -> None:
    """The dashboard's step boxes say what a sql/pattern filter, a JSONata convert and an
    enrich step do (not only their keys), and an enrich URL's credentials are not shown."""
    from eventbus.observability._view import topology

    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "x"},
        "spec": {
            "sources": [{"kafka": {"topic": "a"}}],
            "steps": [
                {"id": "f", "filter": {"sql": "type LIKE 'order.%'"}},
                {"id": "p", "filter": {"pattern": {"type": [{"prefix": "order."}]}}},
                {"id": "c", "filter": "data.n > 1"},
                {
                    "id": "e",
                    "enrich": {"http": {"url": "http://u:pw@h/c/{data.id}"}, "into": "data.c"},
                },
                {"id": "r", "enrich": {"redis": {"key": "'c:' + data.id"}}},
                {"id": "j", "convert": {"jsonata": "$merge([$, {'type': type & '.v2'}])"}},
                {"id": "s", "convert": {"set": {"data.x": "1"}, "remove": ["data.y"]}},
            ],
            "sink": {"kafka": {"topic": "b"}},
        },
    }
    details = {s["id"]: s["detail"] for s in topology(doc)["steps"]}
    assert details["f"] == "sql: type LIKE 'order.%'"
    assert details["p"] == 'pattern: {"type":[{"prefix":"order."}]}'
    assert details["c"] == "data.n > 1"
    assert (
        details["e"].startswith("GET http://h/c/{data.id} -> data.c") and "pw" not in details["e"]
    )
    assert details["r"] == "redis 'c:' + data.id"
    assert details["j"] == "jsonata: $merge([$, {'type': type & '.v2'}])"
    assert details["s"] == "remove, set"
