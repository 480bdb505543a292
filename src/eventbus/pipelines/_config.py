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

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    StringConstraints,
    create_model,
    field_validator,
    model_validator,
)

from eventbus import registry
from eventbus.eventing.sources._http_config import ingress_topic
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.observability._config import ObservabilityConfig
from eventbus.pipelines._autoscaling_config import AutoscalingConfig
from eventbus.pipelines._guarantee import guarantee_problems
from eventbus.pipelines._routes_config import (
    RouteConfig,
    SinkName,
    loop_problems,
    route_problems,
)
from eventbus.pipelines.steps._allocate_config import AllocateConfig
from eventbus.pipelines.steps._convert import ConvertConfig
from eventbus.pipelines.steps._filter import FilterDialect
from eventbus.pipelines.steps._function import FunctionStepConfig
from eventbus.pipelines.steps._join_config import JoinConfig, JoinOutputConfig, JoinSideConfig
from eventbus.pipelines.steps._model_config import (
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
    "RouteConfig",
    "ServingConfig",
    "SinkConfig",
    "SourceConfig",
    "StepConfig",
    "model_refs",
]

_MODEL = ConfigDict(extra="forbid", frozen=True)

StepId = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")]
PipelineName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,47}$")]
HostName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,42}$")]


class MetadataConfig(BaseModel):
    """Pipeline identity."""

    model_config = _MODEL
    name: PipelineName = Field(
        description="Pipeline name: lowercase letters, digits and '-', starting with a letter; "
        "at most 48 characters; not starting with 'model-' or 'host-' (model applications are "
        "named eventbus-model-NAME, shared hosts eventbus-host-NAME). It names the Ray Serve "
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
        if name.startswith("host-"):
            rest = name.removeprefix("host-").strip("-")
            msg = (
                f"must not start with 'host-' (its Serve application eventbus-{name} would clash "
                f"with the one of host {rest!r}); got {name!r}; rename the pipeline, e.g. "
                f"{(rest + '-pipeline')[:48]!r}"
            )
            raise ValueError(msg)
        return name


class _KindKeyed(BaseModel):
    """A config whose one key names a registered kind (``- kafka: {...}``, ``filter: ...``);
    the concrete models are built from the registries (see :func:`_kind_model`)."""

    model_config = _MODEL
    #: the kinds this model was built with, in registry order
    kind_names: ClassVar[tuple[str, ...]] = ()

    @property
    def kind(self) -> str:
        """The registered kind this config names."""
        return next(k for k in self.kind_names if getattr(self, k) is not None)

    @property
    def options(self) -> Any:
        """The kind's own config (the value under its key)."""
        return getattr(self, self.kind)

    def _set_kinds(self) -> list[str]:
        return [k for k in self.kind_names if getattr(self, k) is not None]

    if TYPE_CHECKING:  # the kind keys are fields built from the registry

        def __getattr__(self, name: str) -> Any: ...


def _either(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class _SourceBase(_KindKeyed):
    """One event source: exactly one transport key."""

    @model_validator(mode="after")
    def _one_transport(self) -> _SourceBase:
        keys = self._set_kinds()
        if len(keys) != 1:
            got = ", ".join(keys) or "none"
            msg = (
                f"a source needs exactly one transport key ({_either(self.kind_names)}); got {got}; "
                "write one source per list item, e.g. '- kafka: {topic: ...}'"
            )
            raise ValueError(msg)
        return self


class _SinkBase(_KindKeyed):
    """Where outputs (or dead letters) go: exactly one transport key."""

    @model_validator(mode="after")
    def _one_transport(self) -> _SinkBase:
        keys = self._set_kinds()
        if not keys:
            msg = "a sink needs exactly one transport key; add 'kafka: {topic: ...}'"
            raise ValueError(msg)
        if len(keys) > 1:
            msg = f"a sink needs exactly one transport key ({_either(self.kind_names)}); got {', '.join(keys)}"
            raise ValueError(msg)
        return self


class _StepBase(_KindKeyed):
    """One step: an ``id`` and exactly one kind key."""

    @model_validator(mode="after")
    def _one_template(self) -> _StepBase:
        keys = self._set_kinds()
        if len(keys) != 1:
            got = ", ".join(keys) or "none"
            msg = f"step {self.id!r} needs exactly one of {', '.join(self.kind_names)}; got {got}"
            raise ValueError(msg)
        return self

    @property
    def template(self) -> str:
        """The kind of this step (the metrics' ``template`` label)."""
        return self.kind


def _kind_model(
    name: str,
    base: type[_KindKeyed],
    kinds: registry.Registry[Any],
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> Any:
    """The pydantic model of one kind-keyed config: one optional field per registered kind
    (built-ins in their order, then plugins), between the ``before`` and ``after`` fields."""
    fields: dict[str, Any] = dict(before or {})
    for reg in kinds:
        fields[reg.name] = (reg.config | None, Field(default=None, description=reg.description))
    fields.update(after or {})
    model = create_model(name, __base__=base, __module__=__name__, **fields)
    model.kind_names = tuple(kinds.names())
    model.__doc__ = base.__doc__
    return model


if TYPE_CHECKING:
    SourceConfig = _SourceBase
    SinkConfig = _SinkBase
    StepConfig = _StepBase
else:
    SourceConfig = _kind_model("SourceConfig", _SourceBase, registry.sources)
    SinkConfig = _kind_model("SinkConfig", _SinkBase, registry.sinks)
    StepConfig = _kind_model(
        "StepConfig",
        _StepBase,
        registry.steps,
        before={
            "id": (
                StepId,
                Field(description="Step id: ^[a-z][a-z0-9_]*$ (no dots); unique in the pipeline."),
            )
        },
        after={
            "retries": (
                Annotated[int, Field(ge=0, le=100)] | None,
                Field(
                    default=None,
                    description="Retries of events failing in this step (overrides delivery.retries).",
                ),
            )
        },
    )


def model_refs(step: StepConfig) -> list[Any]:
    """The models a step config calls (its kind's ``models`` trait; none for most kinds)."""
    models = registry.steps.get(step.kind).trait("models")
    return list(models(step.options)) if models is not None else []


class BackoffConfig(BaseModel):
    """Exponential backoff between retries (of events, dispatches and sink sends), jittered."""

    model_config = _MODEL
    initial_ms: PositiveInt = Field(default=100, description="First delay (its upper bound).")
    max_ms: PositiveInt = Field(default=5000, description="Largest delay.")
    jitter: Annotated[float, Field(ge=0, le=1)] = Field(
        default=1.0,
        description="Fraction of each delay drawn at random (1: full jitter, anywhere up to "
        "the delay; 0.2: 80-100% of it; 0: none), so sources that failed together do not "
        "retry together.",
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
    guarantee: Literal["at_least_once", "exactly_once"] = Field(
        default="at_least_once",
        description="'at_least_once' (with dedupe: effectively once at the sink), or "
        "'exactly_once': each batch's outputs, dead letters and source offsets in one Kafka "
        "transaction (Kafka sources and sinks of one cluster, stateless steps; readers of the "
        "sink use isolation.level=read_committed). No Redis needed.",
    )


class ReplicasConfig(BaseModel):
    """Replica bounds; ``min == max`` pins the count, otherwise Serve autoscales. ``min: 0``:
    the controller scales the replicas to zero after ``idle_s`` without events and back to one
    when events wait (lag on a source topic) or a sync call comes."""

    model_config = _MODEL
    min: Annotated[int, Field(ge=0)] = Field(
        default=1,
        description="Fewest replicas. 0: scale to zero after idle_s without events and lag; "
        "the pipeline wakes (one replica) when its topics have lag or a sync call comes.",
    )
    max: PositiveInt = Field(default=1, description="Most replicas.")
    idle_s: PositiveFloat = Field(
        default=300,
        description="With min 0: seconds without events, lag or sync calls before the replicas "
        "go to zero.",
    )
    poll_s: Annotated[float, Field(ge=0.1, le=60)] = Field(
        default=1.0,
        description="With min 0: how often the controller compares the source topics' end "
        "offsets with the committed ones (the wake-up delay of events waiting at zero).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> ReplicasConfig:
        if self.min > self.max:
            msg = f"replicas.min ({self.min}) is larger than replicas.max ({self.max}); make max >= min"
            raise ValueError(msg)
        extra = sorted({"idle_s", "poll_s"} & self.model_fields_set)
        if self.min > 0 and extra:
            msg = (
                f"replicas.{extra[0]} is set but replicas.min is {self.min}; it applies to "
                "scale to zero only: set min: 0, or drop it"
            )
            raise ValueError(msg)
        return self

    @property
    def scale_to_zero(self) -> bool:
        """Whether the replicas may go to zero (``min: 0``)."""
        return self.min == 0


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
    host: HostName | None = Field(
        default=None,
        description="Run this pipeline in the shared replica process(es) of host HOST (Serve "
        "application eventbus-host-HOST) with every other pipeline naming the same host, instead "
        "of in replicas of its own: an idle pipeline then costs no process of its own (cheap "
        "idle), at the price of isolation (one process, one Python environment, one CPU share). "
        "The host runs as many replicas as its largest member asks (replicas: N). Not with "
        "runtime_env, memory_mb, num_cpus, autoscaling, replica bounds, min 0 or "
        "source_placement: actor.",
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
        if self.host is not None:
            _check_hostable(self)
        if bounds.scale_to_zero and self.source_placement != "replica":
            msg = (
                f"serving.replicas.min is 0 but source_placement is {self.source_placement!r}: "
                "only replicas that consume scale to zero (source actors keep running); set "
                "source_placement: replica, or min: 1"
            )
            raise ValueError(msg)
        return self

    @property
    def replica_bounds(self) -> ReplicasConfig:
        """Replica bounds, also when given as a plain count."""
        if isinstance(self.replicas, int):
            return ReplicasConfig(min=self.replicas, max=self.replicas)
        return self.replicas


def _check_hostable(serving: ServingConfig) -> None:
    """Settings that cannot hold for one pipeline in a process shared with others.

    Raises:
        ValueError: naming the field, its value and the fix.
    """
    bounds = serving.replica_bounds
    fix = "drop it, or drop serving.host to run the pipeline in replicas of its own"
    bad: list[tuple[str, Any, str]] = [
        ("runtime_env", serving.runtime_env, "a shared process has one Python environment"),
        ("memory_mb", serving.memory_mb, "memory is reserved per process, not per pipeline"),
        ("autoscaling", serving.autoscaling, "the host's replica count is shared"),
    ]
    if serving.num_cpus:
        bad.append(("num_cpus", serving.num_cpus, "CPUs are reserved per process"))
    if serving.source_placement != "replica":
        bad.append(
            ("source_placement", serving.source_placement, "a host runs its members' sources")
        )
    for field, value, why in bad:
        if value is not None:
            shown = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            msg = f"serving.{field} is {shown!r} but serving.host is {serving.host!r}: {why}; {fix}"
            raise ValueError(msg)
    if bounds.min != bounds.max or bounds.min == 0:
        msg = (
            f"serving.replicas is {{min: {bounds.min}, max: {bounds.max}}} but serving.host is "
            f"{serving.host!r}: a host runs a fixed replica count shared by its members (no "
            f"scale to zero, no autoscaling); give replicas: N (N >= 1), or {fix}"
        )
        raise ValueError(msg)


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

    @model_validator(mode="after")
    def _unique_step_ids(self) -> PipelineSpecConfig:
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
