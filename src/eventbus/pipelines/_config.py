"""Pipeline YAML v1 as pydantic models (frozen, unknown fields rejected).

```yaml
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: large-payments}
spec:
  sources: [{kafka: {topic: payments}}]
  steps:
    - id: only_large
      filter: "type == 'payment.created' && data.amount > 100"
    - id: to_cny
      convert: {set: {"data.amount_cny": "data.amount * 7.1", "type": "'payment.large'"}}
  sink: {kafka: {topic: payments-large}}
```
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from eventbus import registry
from eventbus.eventing.sources._http_config import ingress_topic
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.observability._config import ObservabilityConfig
from eventbus.pipelines._autoscaling_config import AutoscalingConfig
from eventbus.pipelines._delivery_config import DedupeConfig, DeliveryConfig
from eventbus.pipelines._guarantee import guarantee_problems
from eventbus.pipelines._kinds_config import SinkConfig, SourceConfig, StepConfig, model_refs
from eventbus.pipelines._routes_config import (
    RouteConfig,
    SinkName,
    loop_problems,
    route_problems,
)
from eventbus.pipelines._serving_config import BatchConfig, ReplicasConfig, ServingConfig
from eventbus.pipelines.steps._allocate_config import AllocateConfig
from eventbus.pipelines.steps._convert import ConvertConfig
from eventbus.pipelines.steps._filter import FilterDialect
from eventbus.pipelines.steps._function import FunctionStepConfig
from eventbus.pipelines.steps._join_config import JoinConfig, JoinOutputConfig, JoinSideConfig
from eventbus.pipelines.steps._model_config import (
    EnsembleConfig,
    EnsembleMemberConfig,
    ModelPoolConfig,
    ModelServingConfig,
    ModelStepConfig,
    PoolName,
    pool_problems,
)

__all__ = [
    "AllocateConfig",
    "AutoscalingConfig",
    "BatchConfig",
    "ConvertConfig",
    "DedupeConfig",
    "DeliveryConfig",
    "EnsembleConfig",
    "EnsembleMemberConfig",
    "FilterDialect",
    "FunctionStepConfig",
    "JoinConfig",
    "JoinOutputConfig",
    "JoinSideConfig",
    "MetadataConfig",
    "ModelPoolConfig",
    "ModelServingConfig",
    "ModelStepConfig",
    "PipelineConfig",
    "PipelineSpecConfig",
    "ReplicasConfig",
    "RouteConfig",
    "ServingConfig",
    "SinkConfig",
    "SourceConfig",
    "StepConfig",
    "model_refs",
]

_MODEL = ConfigDict(extra="forbid", frozen=True)

PipelineName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,47}$")]


class MetadataConfig(BaseModel):
    """Pipeline identity."""

    model_config = _MODEL
    name: PipelineName = Field(
        description="Pipeline name: lowercase letters, digits and '-', starting with a letter; "
        "at most 48 characters; not starting with 'model-', 'pool-' or 'host-' (model applications are "
        "named eventbus-model-NAME, model pools eventbus-pool-NAME, shared hosts eventbus-host-NAME). It names the Ray Serve "
        "application and the consumer group."
    )
    description: str | None = Field(default=None, description="Free text for humans.")

    @field_validator("name")
    @classmethod
    def _not_a_model_app_name(cls, name: str) -> str:
        # Pipelines run as Serve app `eventbus-<name>`, models as `eventbus-model-<model>`:
        # pipeline `model-x` would take (or replace) the application of model `x`.
        if name.startswith("model-"):
            rest = name.removeprefix("model-").strip("-")
            suggest = f"{rest}-pipeline" if rest[:1].isalpha() and len(rest) <= 39 else "scoring"
            msg = (
                f"must not start with 'model-' (its Serve application eventbus-{name} would clash with "
                f"the one of model {rest!r}); got {name!r}; rename the pipeline, e.g. {suggest!r}"
            )
            raise ValueError(msg)
        if name.startswith("pool-"):
            msg = (
                f"must not start with 'pool-' (its Serve application eventbus-{name} would clash "
                f"with the one of model pool {name.removeprefix('pool-')!r}); got {name!r}; rename "
                "the pipeline"
            )
            raise ValueError(msg)
        if name.startswith("host-"):
            rest = name.removeprefix("host-").strip("-")
            msg = (
                f"must not start with 'host-' (its Serve application eventbus-{name} would clash "
                f"with the one of host {rest!r}); got {name!r}; rename the pipeline, e.g. "
                f"{(rest + '-pipeline')[:48]!r}"
            )
            raise ValueError(msg)
        return name


class PipelineSpecConfig(BaseModel):
    """What the pipeline does."""

    model_config = _MODEL
    sources: Annotated[list[SourceConfig], Field(min_length=1)] = Field(
        description="Where events come from."
    )
    steps: list[StepConfig] = Field(
        default_factory=list, description="Steps, run in order over each batch."
    )
    sink: SinkConfig | None = Field(
        default=None,
        description="Where every output event goes (one sink); or give sinks with routes.",
    )
    sinks: dict[SinkName, SinkConfig] | None = Field(
        default=None,
        description="Named sinks that routes send output events to (instead of sink).",
    )
    routes: Annotated[list[RouteConfig], Field(min_length=1, max_length=64)] | None = Field(
        default=None,
        description="Which events go to which of sinks: every route whose 'when' holds gets "
        "the event; the default route gets those no other route took.",
    )
    dead_letter: SinkConfig | None = Field(
        default=None, description="Where failed events go, with the error."
    )
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig, description="Retries.")
    serving: ServingConfig = Field(
        default_factory=ServingConfig, description="Replicas and batching."
    )
    observability: ObservabilityConfig = Field(
        default_factory=ObservabilityConfig, description="Traces and log format of the replicas."
    )
    model_pools: Annotated[dict[PoolName, ModelPoolConfig], Field(max_length=64)] = Field(
        default_factory=dict,
        description="Multiplexed model pools that model steps name with 'pool': each one Serve "
        "application (eventbus-pool-NAME) whose replicas hold up to max_models_per_replica models.",
    )

    @field_validator("dead_letter")
    @classmethod
    def _dead_letters_as_they_came(cls, sink: SinkConfig | None) -> SinkConfig | None:
        if sink is not None and getattr(sink.kafka, "value_format", "json") != "json":
            msg = (
                "a dead-letter topic keeps each failed event as it came (JSON, or the raw "
                "record that did not decode), never in a schema; remove value_format"
            )
            raise ValueError(msg)
        return sink

    @model_validator(mode="after")
    def _unique_step_ids(self) -> PipelineSpecConfig:
        problems = pool_problems(self.steps, self.model_pools)
        if problems:
            raise ValueError("\n".join(problems))
        seen: set[str] = set()
        for step in self.steps:
            if step.id in seen:
                msg = f"step id {step.id!r} is used twice; step ids must be unique in a pipeline"
                raise ValueError(msg)
            seen.add(step.id)
        problems = route_problems(self.routes, self.sinks, self.sink)
        if problems:
            raise ValueError("\n".join(problems))
        problems = guarantee_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        by_kind: dict[str, list[Any]] = {}
        for src in self.sources:
            by_kind.setdefault(src.kind, []).append(src.options)
        for kind, configs in by_kind.items():
            check = registry.sources.get(kind).trait("check_all")
            if check is not None:
                check(configs)
            if (
                registry.sources.get(kind).trait("needs_replicas")
                and self.serving.replica_bounds.min == 0
            ):
                msg = (
                    f"a {kind} source runs on the pipeline's replicas, but serving.replicas.min "
                    f"is 0 (scaled to zero, it would not run); set serving.replicas.min: 1"
                )
                raise ValueError(msg)
        return self

    def outputs(self) -> dict[str, SinkConfig]:
        """The output sinks by name: ``sinks``, or ``{"sink": sink}`` for a single sink."""
        if self.sinks is not None:
            return dict(self.sinks)
        return {"sink": self.sink} if self.sink is not None else {}

    def output_paths(self) -> dict[str, SinkConfig]:
        """Every sink by its YAML path (``sink``, ``sinks.NAME``, ``dead_letter``)."""
        out = {
            ("sink" if self.sinks is None else f"sinks.{k}"): v for k, v in self.outputs().items()
        }
        if self.dead_letter is not None:
            out["dead_letter"] = self.dead_letter
        return out


class PipelineConfig(BaseModel):
    """A pipeline document (``apiVersion: eventbus/v1``, ``kind: Pipeline``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    api_version: Literal["eventbus/v1"] = Field(
        alias="apiVersion", description="Always 'eventbus/v1'."
    )
    kind: Literal["Pipeline"] = Field(description="Always 'Pipeline'.")
    metadata: MetadataConfig = Field(description="Name and description.")
    spec: PipelineSpecConfig = Field(description="Sources, steps, sink, delivery, serving.")

    @model_validator(mode="after")
    def _no_loop(self) -> PipelineConfig:
        problems = loop_problems(self.spec.output_paths(), self.name)
        if problems:
            raise ValueError("\n".join(f"spec.{p}" for p in problems))
        return self

    @property
    def name(self) -> str:
        """The pipeline name."""
        return self.metadata.name

    def linger_ms_of(self, source: KafkaSourceConfig) -> int:
        """How long one of :attr:`consumed_sources` lingers between fetches."""
        return self.spec.serving.batch.linger_ms_of(
            ingress=source.topic == ingress_topic(self.name)
        )

    @property
    def in_order(self) -> bool:
        """Some step's state depends on the order of its events (its kind declares
        ``ordered=True``: join, aggregate): the batches after one whose dispatch failed wait for
        its retry (``FetchSettings.in_order``)."""
        return any(registry.steps.get(s.kind).trait("ordered", False) for s in self.spec.steps)

    @property
    def consumed_sources(self) -> list[KafkaSourceConfig]:
        """The topics the replicas consume: each ``kafka`` source, then the ingress topic the
        gateway writes ``http``/``grpc`` events to (one, whatever their number). Each source
        kind's factory says what its source consumes."""
        out: list[KafkaSourceConfig] = []
        ordered = sorted(
            self.spec.sources, key=lambda s: bool(registry.sources.get(s.kind).trait("ingress"))
        )
        for src in ordered:
            consumed = registry.sources.get(src.kind).factory(src.options, self.name)
            if consumed is not None and consumed not in out:
                out.append(consumed)
        return out

    def to_document(self) -> dict[str, Any]:
        """The pipeline as a plain YAML/JSON document (aliases, defaults left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)
