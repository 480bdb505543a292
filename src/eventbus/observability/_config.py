"""The ``observability:`` section of a pipeline: traces and log format of its replicas."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ObservabilityConfig", "TracingConfig"]

_MODEL = ConfigDict(extra="forbid", frozen=True)


class TracingConfig(BaseModel):
    """OpenTelemetry traces of the pipeline's replicas (continuing the events' ``traceparent``)."""

    model_config = _MODEL
    otlp_endpoint: str | None = Field(
        default=None,
        description="Base URL of an OTLP/HTTP receiver (e.g. http://127.0.0.1:4318); default: the "
        "replica's OTEL_EXPORTER_OTLP_ENDPOINT. Tracing stays off when neither is set.",
    )
    sample_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        default=1.0,
        description="Share of root traces kept (events arriving with a sampled traceparent are always continued).",
    )


class ObservabilityConfig(BaseModel):
    """Traces and logs of the pipeline's replicas (metrics are always on)."""

    model_config = _MODEL
    tracing: TracingConfig | None = Field(
        default=None, description="Export traces (off when absent)."
    )
    logs: Literal["text", "json"] = Field(
        default="text",
        description="Replica log format: json writes one JSON object per line with pipeline, step and event id.",
    )
