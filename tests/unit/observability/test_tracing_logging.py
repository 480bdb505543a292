"""Traces across gateway, replica run and sink in process (InMemorySpanExporter), JSON logs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import orjson
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from eventbus import CloudEvent
from eventbus.observability import (
    JsonFormatter,
    TracedSink,
    configure_tracing,
    shutdown_tracing,
    tracer,
)
from eventbus.observability._tracing import end_spans, run_traced, start_event_spans
from eventbus.pipelines import PipelineRunner, load_pipeline_text

YAML = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: tr}
spec:
  sources: [{http: {path: /tr}}]
  steps:
    - {id: large, filter: "data.amount > 100"}
    - {id: cny, convert: {set: {"data.cny": "data.amount * 7"}}}
  sink: {kafka: {topic: out}}
"""


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    configure_tracing(exporter=exp)
    yield exp
    shutdown_tracing()


class _Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[CloudEvent, bytes | None]] = []

    async def send(self, items: list[tuple[CloudEvent, bytes | None]]) -> None:
        self.sent.extend(items)


def test_off_by_default_and_costs_nothing() -> None:
    assert tracer() is None
    e = CloudEvent.create(type="t", source="/s", data={})
    assert start_event_spans("x", [e]) == []
    assert "traceparent" not in e.attributes


def test_one_trace_from_gateway_through_the_steps_to_the_sink(
    exporter: InMemorySpanExporter,
) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    events = [
        CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"amount": a})
        for i, a in enumerate((500, 5, "x"))
    ]
    spans = start_event_spans(
        "eventbus.gateway tr",
        events,
        request_traceparent=parent,
        attributes={"eventbus.pipeline": "tr"},
    )
    assert all(
        e.attributes["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
        for e in events
    )
    runner = PipelineRunner(load_pipeline_text(YAML, "tr.yaml"))
    outcomes = run_traced(runner, events)
    (out,) = outcomes[0]
    sink = _Sink()
    asyncio.run(TracedSink(sink, "eventbus.sink out").send([(out, None)]))
    end_spans(spans)
    finished = {
        s.name + ":" + str(s.attributes.get("cloudevents.event_id")): s
        for s in exporter.get_finished_spans()
    }
    gw = finished["eventbus.gateway tr:e0"]
    proc = finished["eventbus.process tr:e0"]
    send = finished["eventbus.sink out:e0"]
    assert {s.context.trace_id for s in (gw, proc, send)} == {0x0AF7651916CD43DD8448EB211C80319C}
    assert gw.parent.span_id == 0xB7AD6B7169203331
    assert proc.parent.span_id == gw.context.span_id and send.parent.span_id == proc.context.span_id
    assert proc.attributes["eventbus.outcome"] == "output"
    assert finished["eventbus.process tr:e1"].attributes["eventbus.outcome"] == "dropped"
    assert (
        sink.sent[0][0].attributes["traceparent"]
        == f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}-01"
    )


def test_unsampled_events_get_no_replica_spans(exporter: InMemorySpanExporter) -> None:
    e = CloudEvent.create(
        type="t",
        source="/s",
        data={"amount": 500},
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
    )
    run_traced(
        PipelineRunner(load_pipeline_text(YAML, "tr.yaml")),
        [e, CloudEvent.create(type="t", source="/s", data={"amount": 500})],
    )
    assert exporter.get_finished_spans() == ()


def test_sample_ratio_zero_stamps_nothing() -> None:
    exp = InMemorySpanExporter()
    configure_tracing(exporter=exp, sample_ratio=0.0)
    try:
        e = CloudEvent.create(type="t", source="/s", data={})
        end_spans(start_event_spans("g", [e]))
        assert "traceparent" not in e.attributes and exp.get_finished_spans() == ()
    finally:
        shutdown_tracing()


def test_json_log_lines_carry_pipeline_step_and_event_id() -> None:
    f = JsonFormatter({"pipeline": "orders", "replica": "r1"})
    r = logging.LogRecord(
        "eventbus.x", logging.ERROR, __file__, 1, "event %s failed", ("e1",), None
    )
    r.step, r.event_id = "score", "e1"
    line = orjson.loads(f.format(r))
    assert (
        line["message"] == "event e1 failed"
        and line["level"] == "error"
        and line["logger"] == "eventbus.x"
    )
    assert (line["pipeline"], line["step"], line["event_id"], line["replica"]) == (
        "orders",
        "score",
        "e1",
        "r1",
    )
    assert line["ts"].endswith("Z")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        r2 = logging.LogRecord("eventbus.x", logging.ERROR, __file__, 1, "x", None, sys.exc_info())
    assert "ValueError: boom" in orjson.loads(f.format(r2))["exc"]


def test_a_failed_event_logs_one_json_line_with_pipeline_step_and_event_id() -> None:
    import io

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter({"replica": "r1"}))
    logger = logging.getLogger("eventbus.pipelines.runner")
    logger.addHandler(handler)
    try:
        r = PipelineRunner(load_pipeline_text(YAML, "tr.yaml"))
        ok = CloudEvent.create(type="t", source="/s", id="good", data={"amount": 500})
        bad = CloudEvent.create(
            type="t", source="/s", id="bad", data={"amount": 200.5}
        )  # double * int
        outcomes = r.run([ok, bad, ok])
    finally:
        logger.removeHandler(handler)
    assert [type(o).__name__ for o in outcomes] == ["list", "Failure", "list"]
    lines = [orjson.loads(ln) for ln in buf.getvalue().splitlines()]
    assert len(lines) == 1, lines  # none for the events that went through
    (line,) = lines
    assert (line["pipeline"], line["step"], line["event_id"], line["replica"], line["level"]) == (
        "tr",
        "cny",
        "bad",
        "r1",
        "warning",
    )
    assert "failed in step 'cny'" in line["message"]
