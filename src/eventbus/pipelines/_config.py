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
    PositiveInt,
    StringConstraints,
    field_validator,
    model_validator,
)

from eventbus.eventing.sinks._kafka import KafkaSinkConfig
from eventbus.eventing.sources._http_config import GrpcSourceConfig, HttpSourceConfig, ingress_topic
from eventbus.eventing.sources._kafka import KafkaSourceConfig
from eventbus.observability._config import ObservabilityConfig
from eventbus.pipelines._allocate import AllocateConfig
from eventbus.pipelines._autoscaling_config import AutoscalingConfig
from eventbus.pipelines._join_config import JoinConfig, JoinOutputConfig, JoinSideConfig
from eventbus.pipelines._model_config import (
    EnsembleConfig,
    EnsembleMemberConfig,
    ModelServingConfig,
    ModelStepConfig,
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
    "ModelServingConfig",
    "ModelStepConfig",
    "PipelineConfig",
    "PipelineSpecConfig",
    "ReplicasConfig",
    "ServingConfig",
    "SinkConfig",
    "SourceConfig",
    "StepConfig",
]

_MODEL = ConfigDict(extra="forbid", frozen=True)

StepId = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")]
PipelineName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,47}$")]
CelSource = Annotated[str, StringConstraints(min_length=1)]
#: A path a convert step writes: an attribute name, or ``data`` / ``data.a.b``.
TargetPath = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]+(\.[A-Za-z_][A-Za-z0-9_-]*)*$")]


class MetadataConfig(BaseModel):
    """Pipeline identity."""

    model_config = _MODEL
    name: PipelineName = Field(
        description="Pipeline name: lowercase letters, digits and '-', starting with a letter; "
        "at most 48 characters; not starting with 'model-' (model applications are named "
        "eventbus-model-NAME). It names the Ray Serve application and the consumer group."
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
        return name


class SourceConfig(BaseModel):
    """One event source: exactly one transport key."""

    model_config = _MODEL
    kafka: KafkaSourceConfig | None = Field(default=None, description="Consume a Kafka topic.")
    http: HttpSourceConfig | None = Field(
        default=None, description="Accept events over HTTP at the gateway."
    )
    grpc: GrpcSourceConfig | None = Field(
        default=None, description="Accept events over gRPC at the gateway."
    )

    @model_validator(mode="after")
    def _one_transport(self) -> SourceConfig:
        keys = [k for k in ("kafka", "http", "grpc") if getattr(self, k) is not None]
        if len(keys) != 1:
            got = ", ".join(keys) or "none"
            msg = (
                f"a source needs exactly one transport key (kafka, http or grpc); got {got}; "
                "write one source per list item, e.g. '- kafka: {topic: ...}'"
            )
            raise ValueError(msg)
        return self


class SinkConfig(BaseModel):
    """Where outputs (or dead letters) go: exactly one transport key."""

    model_config = _MODEL
    kafka: KafkaSinkConfig | None = Field(default=None, description="Produce to a Kafka topic.")

    @model_validator(mode="after")
    def _one_transport(self) -> SinkConfig:
        if self.kafka is None:
            msg = "a sink needs exactly one transport key; add 'kafka: {topic: ...}'"
            raise ValueError(msg)
        return self


class FilterDialect(BaseModel):
    """A CloudEvents Subscriptions API filter (Knative triggers): exactly one dialect key.

    ``exact``/``prefix``/``suffix`` map attribute names to strings; ``all``/``any`` hold lists
    of filters; ``not`` one filter; ``cel`` a CEL expression.
    """

    model_config = _MODEL
    exact: dict[str, str] | None = Field(
        default=None, description="Every attribute equals the value."
    )
    prefix: dict[str, str] | None = Field(
        default=None, description="Every attribute starts with the value."
    )
    suffix: dict[str, str] | None = Field(
        default=None, description="Every attribute ends with the value."
    )
    all: list[FilterDialect | CelSource] | None = Field(
        default=None, description="Every filter matches."
    )
    any: list[FilterDialect | CelSource] | None = Field(
        default=None, description="At least one filter matches."
    )
    not_: FilterDialect | CelSource | None = Field(
        default=None, alias="not", description="The filter does not match."
    )
    cel: CelSource | None = Field(default=None, description="A CEL boolean expression.")

    @model_validator(mode="after")
    def _one_dialect(self) -> FilterDialect:
        keys = [
            k
            for k in ("exact", "prefix", "suffix", "all", "any", "not_", "cel")
            if getattr(self, k) is not None
        ]
        if len(keys) != 1:
            got = ", ".join(k.rstrip("_") for k in keys) or "none"
            msg = f"a filter dialect takes exactly one of exact, prefix, suffix, all, any, not, cel; got {got}"
            raise ValueError(msg)
        return self


class ConvertConfig(BaseModel):
    """Rewrite events: set paths from CEL expressions, remove paths, or replace ``data``.

    Every expression sees the event as it was before this step (simultaneous assignment).
    """

    model_config = _MODEL
    set: dict[TargetPath, CelSource] = Field(
        default_factory=dict,
        description="Target path -> CEL expression. Paths: an attribute ('type', 'subject', an "
        "extension) or 'data.a.b'.",
    )
    remove: list[TargetPath] = Field(default_factory=list, description="Paths to remove.")
    data: CelSource | None = Field(
        default=None, description="One CEL expression producing the new data."
    )

    @model_validator(mode="after")
    def _something(self) -> ConvertConfig:
        if not self.set and not self.remove and self.data is None:
            msg = "convert does nothing; give 'set', 'remove' or 'data'"
            raise ValueError(msg)
        for path in [*self.set, *self.remove]:
            if path in ("specversion", "id", "source", "type") and path in self.remove:
                msg = f"convert cannot remove the required attribute {path!r}"
                raise ValueError(msg)
            if path == "specversion":
                msg = "convert cannot change 'specversion'; EventBus emits CloudEvents 1.0"
                raise ValueError(msg)
        if self.data is not None and any(p == "data" or p.startswith("data.") for p in self.set):
            msg = "convert has both 'data' and 'set' paths under data; use one of them"
            raise ValueError(msg)
        return self


class FunctionStepConfig(BaseModel):
    """A registered Python function, by import path."""

    model_config = _MODEL
    ref: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")] = Field(
        description="Import path 'package.module:function'."
    )
    batch: bool | None = Field(
        default=None,
        description="Override the function's own batch flag (from @eventbus.function).",
    )


_TEMPLATES = ("filter", "convert", "function", "join", "allocate", "model", "ensemble")


class StepConfig(BaseModel):
    """One step: an ``id`` and exactly one template key."""

    model_config = _MODEL
    id: StepId = Field(description="Step id: ^[a-z][a-z0-9_]*$ (no dots); unique in the pipeline.")
    filter: CelSource | FilterDialect | None = Field(
        default=None, description="Keep events for which this CEL expression (or dialect) is true."
    )
    convert: ConvertConfig | None = Field(default=None, description="Rewrite events.")
    function: (
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")]
        | FunctionStepConfig
        | None
    ) = Field(default=None, description="A Python function 'package.module:function'.")
    join: JoinConfig | None = Field(
        default=None, description="Correlate events of several sides by key (state in Redis)."
    )
    allocate: AllocateConfig | None = Field(
        default=None, description="Pick an item per request at dual prices, within budgets."
    )
    model: ModelStepConfig | None = Field(
        default=None, description="Run each event through a model (its own Ray Serve deployment)."
    )
    ensemble: EnsembleConfig | None = Field(
        default=None, description="Run each event through several models and combine their outputs."
    )
    retries: Annotated[int, Field(ge=0, le=100)] | None = Field(
        default=None,
        description="Retries of events failing in this step (overrides delivery.retries).",
    )

    @model_validator(mode="after")
    def _one_template(self) -> StepConfig:
        keys = [k for k in _TEMPLATES if getattr(self, k) is not None]
        if len(keys) != 1:
            got = ", ".join(keys) or "none"
            msg = f"step {self.id!r} needs exactly one of filter, convert, function, join, allocate, model, ensemble; got {got}"
            raise ValueError(msg)
        return self

    @property
    def template(self) -> str:
        """The template name of this step."""
        return next(k for k in _TEMPLATES if getattr(self, k) is not None)


class BackoffConfig(BaseModel):
    """Exponential backoff between retries."""

    model_config = _MODEL
    initial_ms: PositiveInt = Field(default=100, description="First delay.")
    max_ms: PositiveInt = Field(default=5000, description="Largest delay.")
    jitter: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.2, description="Fraction of each delay drawn at random (0.2: 80-100% of it)."
    )


class DedupeConfig(BaseModel):
    """Effectively-once at the sink: outputs already delivered are not sent again."""

    model_config = _MODEL
    window_s: Annotated[float, Field(gt=0, le=7 * 86400)] = Field(
        default=600,
        description="How long a delivered event (CloudEvent source + id) is remembered in Redis. "
        "Memory: about 90 bytes per event in the window.",
    )


class DeliveryConfig(BaseModel):
    """Retries of a failing event before it is dead-lettered; dedupe at the sink."""

    model_config = _MODEL
    retries: Annotated[int, Field(ge=0, le=100)] = Field(
        default=0,
        description="Retries per event that fails in a step (a step's own 'retries' overrides "
        "it). The event is dispatched again alone, after the backoff; its batch-mates are "
        "delivered meanwhile.",
    )
    backoff: BackoffConfig = Field(
        default_factory=BackoffConfig, description="Delay between retries."
    )
    max_age_s: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Stop retrying an event this long after its first failure (then dead-letter it).",
    )
    dedupe: DedupeConfig | None = Field(
        default=None,
        description="Suppress outputs already delivered (by source + id) within a window, in Redis.",
    )


class ReplicasConfig(BaseModel):
    """Replica bounds; ``min == max`` pins the count, otherwise Serve autoscales."""

    model_config = _MODEL
    min: PositiveInt = Field(default=1, description="Fewest replicas.")
    max: PositiveInt = Field(default=1, description="Most replicas.")

    @model_validator(mode="after")
    def _ordered(self) -> ReplicasConfig:
        if self.min > self.max:
            msg = f"replicas.min ({self.min}) is larger than replicas.max ({self.max}); make max >= min"
            raise ValueError(msg)
        return self


KAFKA_LINGER_MS = 2
INGRESS_LINGER_MS = 25


class BatchConfig(BaseModel):
    """Micro-batching at the source: one Ray call per batch."""

    model_config = _MODEL
    max_size: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=2000, description="Most events per batch."
    )
    linger_ms: Annotated[int, Field(ge=0, le=10_000)] | None = Field(
        default=None,
        description="Least time between two fetches while events keep coming (latency against batch size and "
        "broker load). Default: 2 ms for kafka sources, 25 ms for the ingress topic of http/grpc sources, whose "
        "events were acknowledged to their clients already (on Tansu a fetch costs more the more batches the "
        "topic holds, and the gateway writes many small ones).",
    )

    def linger_ms_of(self, ingress: bool) -> int:
        """The linger of a kafka source (``ingress`` False) or of the ingress topic."""
        if self.linger_ms is not None:
            return self.linger_ms
        return INGRESS_LINGER_MS if ingress else KAFKA_LINGER_MS

    max_in_flight: Annotated[int, Field(ge=1, le=64)] = Field(
        default=4, description="Batches in flight per source."
    )


class RuntimeEnvConfig(BaseModel):
    """The pipeline's own Python environment on Ray (a Ray ``runtime_env``): its packages
    and variables do not touch other pipelines'."""

    model_config = _MODEL
    pip: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        default_factory=list,
        description="Pip requirements installed for this pipeline's replicas only (e.g. 'six==1.16.0'); "
        "installed on first deploy, cached by Ray afterwards.",
    )
    env_vars: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = (
        Field(default_factory=dict, description="Environment variables of the replicas.")
    )
    working_dir: str | None = Field(
        default=None,
        description="A local directory (relative to the pipeline file) shipped to the replicas as their working directory.",
    )

    def to_ray(self, base_dir: str | None = None) -> dict[str, Any]:
        """The Ray ``runtime_env`` dict."""
        import os

        env: dict[str, Any] = {}
        if self.pip:
            env["pip"] = list(self.pip)
        if self.env_vars:
            env["env_vars"] = dict(self.env_vars)
        if self.working_dir:
            env["working_dir"] = (
                self.working_dir if base_dir is None else os.path.join(base_dir, self.working_dir)
            )
        return env


class ServingConfig(BaseModel):
    """How the pipeline runs on Ray Serve."""

    model_config = _MODEL
    replicas: ReplicasConfig | PositiveInt = Field(
        default_factory=ReplicasConfig, description="Replica count or bounds."
    )
    batch: BatchConfig = Field(default_factory=BatchConfig, description="Micro-batching.")
    num_cpus: Annotated[float, Field(ge=0, le=64)] = Field(
        default=0.0, description="CPUs reserved per replica (0 or a fraction on small machines)."
    )
    source_placement: Literal["replica", "actor"] = Field(
        default="replica",
        description="Where Kafka sources run. 'replica': every replica is a consumer-group "
        "member and runs its batches in process (fastest; consumers scale with replicas up to "
        "the partition count). 'actor': one source actor per source calls the deployment once "
        "per batch (compute scales past the partition count, for heavy steps).",
    )
    memory_mb: Annotated[int, Field(ge=16, le=1 << 20)] | None = Field(
        default=None,
        description="Memory reserved per replica in MiB (Ray schedules by it; None: no reservation).",
    )
    runtime_env: RuntimeEnvConfig | None = Field(
        default=None,
        description="This pipeline's own packages, environment variables and working directory (Ray runtime_env).",
    )
    autoscaling: AutoscalingConfig | None = Field(
        default=None,
        description="How replicas scale between replicas.min and replicas.max (on consumer lag, "
        "in-flight batches and event rate; optionally ahead of a forecast daily cycle). Default "
        "when the bounds differ: the reactive policy with its defaults.",
    )

    @model_validator(mode="after")
    def _autoscaling_needs_bounds(self) -> ServingConfig:
        bounds = self.replica_bounds
        if self.autoscaling is not None and bounds.min == bounds.max:
            msg = (
                f"serving.autoscaling is set but replicas are pinned at {bounds.min}; give "
                "replicas: {min: ..., max: ...} with min < max, or drop autoscaling"
            )
            raise ValueError(msg)
        return self

    @property
    def replica_bounds(self) -> ReplicasConfig:
        """Replica bounds, also when given as a plain count."""
        if isinstance(self.replicas, int):
            return ReplicasConfig(min=self.replicas, max=self.replicas)
        return self.replicas


class PipelineSpecConfig(BaseModel):
    """What the pipeline does."""

    model_config = _MODEL
    sources: Annotated[list[SourceConfig], Field(min_length=1)] = Field(
        description="Where events come from."
    )
    steps: list[StepConfig] = Field(
        default_factory=list, description="Steps, run in order over each batch."
    )
    sink: SinkConfig = Field(description="Where output events go.")
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

    @model_validator(mode="after")
    def _unique_step_ids(self) -> PipelineSpecConfig:
        seen: set[str] = set()
        for step in self.steps:
            if step.id in seen:
                msg = f"step id {step.id!r} is used twice; step ids must be unique in a pipeline"
                raise ValueError(msg)
            seen.add(step.id)
        paths: set[str | None] = set()
        for src in self.sources:
            if src.http is not None:
                if src.http.path in paths:
                    shown = src.http.path or "(no path)"
                    msg = f"two http sources share path {shown}; give each http source its own path"
                    raise ValueError(msg)
                paths.add(src.http.path)
        if sum(src.grpc is not None for src in self.sources) > 1:
            msg = "a pipeline takes at most one grpc source (gRPC calls name the pipeline, not a path)"
            raise ValueError(msg)
        return self


class PipelineConfig(BaseModel):
    """A pipeline document (``apiVersion: eventbus/v1``, ``kind: Pipeline``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    api_version: Literal["eventbus/v1"] = Field(
        alias="apiVersion", description="Always 'eventbus/v1'."
    )
    kind: Literal["Pipeline"] = Field(description="Always 'Pipeline'.")
    metadata: MetadataConfig = Field(description="Name and description.")
    spec: PipelineSpecConfig = Field(description="Sources, steps, sink, delivery, serving.")

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
    def consumed_sources(self) -> list[KafkaSourceConfig]:
        """The topics the replicas consume: each ``kafka`` source, then the ingress topic the
        gateway writes ``http``/``grpc`` events to (one, whatever their number)."""
        out = [s.kafka for s in self.spec.sources if s.kafka is not None]
        if any(s.kafka is None for s in self.spec.sources):
            out.append(KafkaSourceConfig(topic=ingress_topic(self.name)))
        return out

    def to_document(self) -> dict[str, Any]:
        """The pipeline as a plain YAML/JSON document (aliases, defaults left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)
