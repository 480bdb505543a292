"""The ``spec.serving`` settings of a pipeline: replicas (and scale to zero), micro-batching,
resources, the runtime environment, autoscaling and shared hosts."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    StringConstraints,
    model_validator,
)

from eventbus.pipelines._autoscaling_config import AutoscalingConfig
from eventbus.pipelines._placement_config import PlacementConfig

__all__ = [
    "INGRESS_LINGER_MS",
    "KAFKA_LINGER_MS",
    "BatchConfig",
    "ReplicasConfig",
    "RuntimeEnvConfig",
    "ServingConfig",
]

_MODEL = ConfigDict(extra="forbid", frozen=True)

HostName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,42}$")]


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
    placement: PlacementConfig | None = Field(
        default=None,
        description="Which Ray nodes (hosts) the replicas may use (node_labels) and whether "
        "they spread one per node (spread); checked against the live nodes at deploy.",
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
        ("placement", serving.placement, "the host's replicas are placed for all its members"),
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
