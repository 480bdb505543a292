"""OpenTelemetry traces, gateway -> replica -> sink, carried in the CloudEvents ``traceparent``.

Off unless configured (:func:`configure_tracing`): then ``tracer()`` is None and every hook
below is one global read, so the hot path pays nothing. When on:

* the gateway starts a span per event (child of the request's or the event's own
  ``traceparent``) and writes the span's context into the event's ``traceparent`` extension
  attribute (the CloudEvents Distributed Tracing extension) before it is published or run;
* a replica continues the trace of each *sampled* input event with one ``process`` span
  covering its batch's run (start and end of the batch; failures and filtering recorded), and
  stamps that span's context into the event's outputs;
* the sink wrapper starts a ``send`` span per sampled output around the sink's send, so the
  output's ``traceparent`` on the sink topic points at it.

Events without a sampled ``traceparent`` get no span in the replica: the gateway (or the
producer) decides sampling (parent-based, with ``sample_ratio`` at the root).
Spans go over OTLP/HTTP to ``otlp_endpoint`` (``OTEL_EXPORTER_OTLP_ENDPOINT``), or to a given
exporter (tests: the SDK's ``InMemorySpanExporter``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # observability sits below eventing: events are only duck-typed here
    from eventbus.eventing._event import CloudEvent

__all__ = [
    "TracedSink",
    "configure_replica",
    "configure_tracing",
    "end_spans",
    "run_traced",
    "shutdown_tracing",
    "start_event_spans",
    "trace_batch",
    "tracer",
]

_tracer: Any = None
_provider: Any = None


def tracer() -> Any:
    """The configured tracer, or None when tracing is off."""
    return _tracer


def configure_tracing(
    *,
    otlp_endpoint: str | None = None,
    exporter: Any = None,
    sample_ratio: float = 1.0,
    service_name: str = "eventbus",
    schedule_delay_ms: int = 1000,
) -> Any:
    """Turn tracing on in this process.

    Args:
        otlp_endpoint: base URL of an OTLP/HTTP receiver (``/v1/traces`` is appended).
        exporter: a span exporter to use instead (spans are exported as they end).
        sample_ratio: the share of root traces kept (children follow their parent).
        service_name: the ``service.name`` resource attribute.
        schedule_delay_ms: how often the OTLP batch processor exports.

    Returns:
        The tracer.

    Raises:
        ValueError: neither an endpoint nor an exporter is given.
    """
    global _tracer, _provider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    if otlp_endpoint is None and exporter is None:
        msg = "configure_tracing needs otlp_endpoint (e.g. http://127.0.0.1:4318) or an exporter"
        raise ValueError(msg)
    shutdown_tracing()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
    )
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = otlp_endpoint.rstrip("/")  # type: ignore[union-attr]
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=schedule_delay_ms
            )
        )
    _provider = provider
    _tracer = provider.get_tracer("eventbus")
    return _tracer


def shutdown_tracing() -> None:
    """Flush and turn tracing off."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def _context(traceparent: str | None) -> Any:
    if not traceparent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def _traceparent(span: Any) -> str | None:
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def start_event_spans(
    name: str,
    events: Sequence[CloudEvent],
    *,
    request_traceparent: str | None = None,
    attributes: dict[str, Any] | None = None,
) -> list[Any]:
    """Start one span per event (gateway), child of the event's ``traceparent`` or else the
    request's, and stamp the span's context into the event. [] when tracing is off."""
    tr = _tracer
    if tr is None:
        return []
    from opentelemetry.trace import SpanKind

    spans = []
    for e in events:
        attrs = e.attributes
        ctx = _context(attrs.get("traceparent") or request_traceparent)
        span = tr.start_span(
            name,
            context=ctx,
            kind=SpanKind.SERVER,
            attributes={
                **(attributes or {}),
                "cloudevents.event_id": str(attrs.get("id")),
                "cloudevents.event_type": str(attrs.get("type")),
            },
        )
        tp = _traceparent(span)
        if tp is not None and span.is_recording():
            attrs["traceparent"] = tp
        spans.append(span)
    return spans


def end_spans(spans: list[Any], error: BaseException | None = None) -> None:
    """End spans started by :func:`start_event_spans` (marking them failed on ``error``)."""
    if not spans:
        return
    from opentelemetry.trace import Status, StatusCode

    for span in spans:
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()


def trace_batch(
    pipeline: str, events: Sequence[CloudEvent], outcomes: Sequence[Any], start_ns: int, end_ns: int
) -> None:
    """Record one ``process`` span per sampled input event of a batch run (replica) and stamp
    its context into the event's outputs."""
    tr = _tracer
    if tr is None:
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode

    name = f"eventbus.process {pipeline}"
    for e, outcome in zip(events, outcomes):
        tp = _event_traceparent(e)
        if not tp or not tp.endswith("-01"):
            continue
        span = tr.start_span(
            name,
            context=_context(tp),
            kind=SpanKind.CONSUMER,
            start_time=start_ns,
            attributes={
                "eventbus.pipeline": pipeline,
                "cloudevents.event_id": str(e.attributes.get("id")),
            },
        )
        if not isinstance(outcome, list):  # a Failure
            span.set_status(
                Status(StatusCode.ERROR, f"{outcome.step}: {outcome.error_type}: {outcome.message}")
            )
            span.set_attribute("eventbus.step", outcome.step)
            span.set_attribute("eventbus.outcome", "failed")
        elif not outcome:
            # no output: filtered, absorbed into a join or window, or late (the steps' counters
            # say which); "dropped" as in the source's stats and the docs' outcome picture
            span.set_attribute("eventbus.outcome", "dropped")
        else:
            span.set_attribute("eventbus.outcome", "output")
            span.set_attribute("eventbus.outputs", len(outcome))
            out_tp = _traceparent(span)
            if out_tp is not None:
                for out in outcome:
                    if _is_event(out):
                        out.attributes["traceparent"] = out_tp
        span.end(end_time=end_ns)


class TracedSink:
    """Wraps a sink: one ``send`` span per sampled event around each send (tracing on only).

    Args:
        sink: the sink to wrap (every other attribute is the sink's).
        name: the span name, e.g. ``eventbus.sink payments-large``.
    """

    def __init__(self, sink: Any, name: str) -> None:
        self._sink = sink
        self._name = name

    def __getattr__(self, item: str) -> Any:
        return getattr(self._sink, item)

    async def send(self, items: Sequence[tuple[CloudEvent, Any]], *args: Any, **kwargs: Any) -> Any:
        tr = _tracer
        if tr is None:
            return await self._sink.send(items, *args, **kwargs)
        from opentelemetry.trace import SpanKind, Status, StatusCode

        spans = []
        for e, _ in items:
            tp = _event_traceparent(e)
            if tp and tp.endswith("-01"):
                span = tr.start_span(
                    self._name,
                    context=_context(tp),
                    kind=SpanKind.PRODUCER,
                    attributes={"cloudevents.event_id": str(e.attributes.get("id"))},
                )
                new_tp = _traceparent(span)
                if new_tp is not None:
                    e.attributes["traceparent"] = new_tp
                spans.append(span)
        try:
            result = await self._sink.send(items, *args, **kwargs)
        except BaseException as exc:
            for span in spans:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                span.end()
            raise
        end = time.time_ns()
        for span in spans:
            span.end(end_time=end)
        return result


def run_traced(runner: Any, events: list[CloudEvent], **options: Any) -> list[Any]:
    """``runner.run(events, **options)`` plus the batch's ``process`` spans (tracing on)."""
    start = time.time_ns()
    outcomes: list[Any] = runner.run(events, **options)
    trace_batch(runner.name, events, outcomes, start, time.time_ns())
    return outcomes


def configure_replica(config: Any, environ: Any, replica: str) -> None:
    """Apply a pipeline's ``observability:`` section in a replica process: JSON logs, and
    tracing when an OTLP endpoint is configured (or in ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    obs = config.spec.observability
    if obs.logs == "json":
        from eventbus.observability._logging import configure_json_logging

        configure_json_logging({"pipeline": config.name, "replica": replica})
    if obs.tracing is not None:
        endpoint = obs.tracing.otlp_endpoint or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if endpoint:
            configure_tracing(
                otlp_endpoint=endpoint,
                sample_ratio=obs.tracing.sample_ratio,
                service_name=f"eventbus-{config.name}",
                schedule_delay_ms=500,
            )


def _is_event(obj: Any) -> bool:
    """A CloudEvent (duck-typed: observability does not import eventing)."""
    return isinstance(getattr(obj, "attributes", None), dict)


def _event_traceparent(obj: Any) -> Any:
    attrs = getattr(obj, "attributes", None)
    return attrs.get("traceparent") if isinstance(attrs, dict) else None
