"""Configuration of the ``model`` and ``ensemble`` steps.

```yaml
    - id: score
      model:
        name: fraud                      # the model in the registry (`eventbus model list`)
        path: fraud.pt2                  # optional: its artifact (version 1 at deploy; `eventbus test` runs it in process)
        input: data.features             # CEL: the model's input row of each event (a list of numbers)
        output: data.fraud_score         # where the output goes, or {path: CEL over `output`, `version`, the event}
    - id: combined
      ensemble:
        models: [{name: fraud, weight: 0.7}, {name: fraud-gbm, weight: 0.3}]
        combine: weighted                # mean | weighted | max | min | a registered combiner | module:attr
        input: data.features
        output: data.score
    - id: regional                       # a model per event, from a multiplexed pool (spec.model_pools)
      model:
        pool: fraud                      # replicas of one Serve application, each holding up to N models (LRU)
        select: "'fraud-' + data.region" # CEL: each event's model name (or `name:` for one model)
        input: data.features
        output: data.score
```
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

__all__ = [
    "EnsembleConfig",
    "EnsembleMemberConfig",
    "ModelPoolConfig",
    "ModelServingConfig",
    "ModelStepConfig",
    "RollbackConfig",
    "pool_problems",
]

_MODEL = ConfigDict(extra="forbid", frozen=True)
ModelName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,47}$")]
ImportRef = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")]
PoolName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,39}$")]
#: Longest ``select`` expression: a model-name picker, not a program.
MAX_SELECT_CHARS = 4096
TargetPath = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]+(\.[A-Za-z_][A-Za-z0-9_-]*)*$")]


class RollbackConfig(BaseModel):
    """When a model version that took a split (or all traffic) is rolled back automatically on
    its live figures, against the previous version's (`eventbus model history` records it)."""

    model_config = _MODEL
    enabled: bool = Field(default=True, description="Judge new versions and roll them back.")
    window_s: Annotated[float, Field(gt=0, le=86_400)] = Field(
        default=60.0, description="The window the figures are taken over, in seconds."
    )
    min_rows: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        default=20, description="Rows the new version must have run in the window to be judged."
    )
    error_rate_margin: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.05,
        description="Roll back when its error rate exceeds the previous version's by more "
        "than this (absolute: 0.05 is five points).",
    )
    p99_ratio: Annotated[float, Field(ge=1, le=1000)] | None = Field(
        default=3.0,
        description="Roll back when its p99 pass latency exceeds this many times the previous "
        "version's (and p99_min_ms; each with 50 passes or more in the window); null: latency "
        "is not judged.",
    )
    p99_min_ms: Annotated[float, Field(ge=0, le=600_000)] = Field(
        default=100.0, description="A p99 at or below this is never a regression, in ms."
    )
    probation_s: Annotated[float, Field(gt=0, le=30 * 86_400)] = Field(
        default=600.0,
        description="How long a version that took all traffic is judged; a split is judged "
        "while it lasts.",
    )


class ModelServingConfig(BaseModel):
    """How a model's own Ray Serve deployment runs (shared by every pipeline using the model;
    the pipeline deployed last sets it)."""

    model_config = _MODEL
    replicas: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=1, description="Replicas of the model deployment."
    )
    num_cpus: Annotated[float, Field(ge=0, le=256)] = Field(
        default=0.0,
        description="CPUs reserved per replica; torch uses max(1, floor(num_cpus)) threads.",
    )
    num_gpus: Annotated[float, Field(ge=0, le=16)] | None = Field(
        default=None,
        description="GPUs per replica; default: 1 when the Ray cluster has a GPU, else 0 (CPU).",
    )
    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = Field(
        default=16,
        description="Most concurrent calls (each a batch of events) merged into one forward pass.",
    )
    batch_wait_ms: Annotated[float, Field(ge=0, le=10_000)] = Field(
        default=1.0, description="How long a forward pass waits for more calls to merge."
    )
    rollback: RollbackConfig = Field(
        default_factory=RollbackConfig,
        description="Automatic rollback of a new version on a live regression.",
    )
    idle_s: Annotated[float, Field(ge=1, le=30 * 86_400)] | None = Field(
        default=None,
        description="Scale the model's application to zero (its replicas' processes released) "
        "after this many seconds without a call; the next call wakes it and waits for it "
        "within the step's timeout_s (a cold start: seconds). Default: never (a call never "
        "pays a cold start).",
    )


class ModelPoolConfig(BaseModel):
    """A multiplexed model pool (``spec.model_pools.<name>``): one Ray Serve application whose
    replicas each hold up to ``max_models_per_replica`` models, evicting the least recently used;
    a model is loaded from the registry on its first call, and calls go to a replica already
    holding it. Shared by every pipeline naming the pool; the pipeline deployed last sets it."""

    model_config = _MODEL
    max_models_per_replica: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=4,
        description="Models one replica holds at once (1..1024); one more evicts the least "
        "recently used. Bounds a replica's memory at this many models.",
    )
    replicas: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=1, description="Replicas of the pool application."
    )
    num_cpus: Annotated[float, Field(ge=0, le=256)] = Field(
        default=0.0,
        description="CPUs reserved per replica; torch uses max(1, floor(num_cpus)) threads.",
    )
    num_gpus: Annotated[float, Field(ge=0, le=16)] | None = Field(
        default=None,
        description="GPUs per replica; default: 1 when the Ray cluster has a GPU, else 0 (CPU).",
    )


class _ModelRef(BaseModel):
    model_config = _MODEL
    name: ModelName = Field(
        description="The model's registry name: its deployment is eventbus-model-<name>."
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        description="Its artifact, relative to the pipeline file: a TorchScript file, a torch.export "
        "program (.pt2), or a state_dict with 'factory'. Pushed as version 1 at deploy when the "
        "registry has no version of the model; `eventbus test` runs it in process.",
    )
    factory: ImportRef | None = Field(
        default=None,
        description="'module:attr' building the nn.Module whose state_dict 'path' holds.",
    )
    serving: ModelServingConfig | None = Field(
        default=None, description="The model deployment's settings."
    )

    @model_validator(mode="after")
    def _factory_needs_path(self) -> _ModelRef:
        if self.factory is not None and self.path is None:
            msg = f"model {self.name!r}: 'factory' builds the module for the state_dict in 'path'; add 'path:' or remove 'factory'"
            raise ValueError(msg)
        return self


class ModelStepConfig(_ModelRef):
    """Run each event's input through a model (``steps: [{id: ..., model: {...}}]``): its own
    Serve application (``name``), or a pool's (``pool`` with ``name`` or ``select``)."""

    name: ModelName | None = Field(  # type: ignore[assignment]
        default=None,
        description="The model's registry name. Without 'pool' its deployment is "
        "eventbus-model-<name>; with 'pool' the pool serves it. Give 'name' or 'select'.",
    )
    pool: PoolName | None = Field(
        default=None,
        description="A pool of spec.model_pools serving the model (multiplexed replicas, "
        "models loaded on first use, LRU), instead of the model's own application.",
    )
    select: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SELECT_CHARS,
        description="CEL giving each event's model name (a string), e.g. \"'fraud-' + "
        "data.region\"; needs 'pool'. An event whose expression fails, gives no string, or names "
        "a model not in the registry is dead-lettered with the reason.",
    )

    input: str = Field(
        min_length=1,
        description="CEL: the event's input row, a (nested) list of numbers, e.g. data.features.",
    )
    output: TargetPath | dict[TargetPath, str] = Field(
        description="A path set to the model's output (a number for one output, else a list), or "
        "a mapping of paths to CEL expressions over 'output', 'version' (the model version that "
        "answered) and the event."
    )
    timeout_s: Annotated[float, Field(gt=0, le=600)] = Field(
        default=30, description="Deadline of one call to the model deployment."
    )

    @model_validator(mode="after")
    def _name_or_select(self) -> ModelStepConfig:
        if self.pool is None:
            if self.select is not None:
                msg = (
                    f"'select' picks each event's model from a pool; got select {self.select[:80]!r} "
                    "without 'pool': add 'pool: NAME' (declared in spec.model_pools) or use 'name:'"
                )
                raise ValueError(msg)
            if self.name is None:
                msg = "give the model's registry 'name' (or 'pool' with 'name' or 'select')"
                raise ValueError(msg)
            return self
        if (self.name is None) == (self.select is None):
            msg = (
                f"a step on pool {self.pool!r} needs exactly one of 'name' (one model) or "
                "'select' (CEL: each event's model name); got "
                + ("both" if self.name is not None else "neither")
            )
            raise ValueError(msg)
        extra = [k for k in ("path", "factory", "serving") if getattr(self, k) is not None]
        if extra:
            msg = (
                f"pool {self.pool!r} loads its models from the registry and is set in "
                f"spec.model_pools; remove {', '.join(repr(k) for k in extra)} and push each model "
                "with `eventbus model push NAME PATH`"
            )
            raise ValueError(msg)
        return self


class EnsembleMemberConfig(_ModelRef):
    """One model of an ensemble."""

    weight: Annotated[float, Field(ge=0)] = Field(
        default=1.0, description="Its weight (combine: weighted)."
    )


class EnsembleConfig(BaseModel):
    """Call several models on the same input and combine their outputs."""

    model_config = _MODEL
    models: Annotated[list[EnsembleMemberConfig], Field(min_length=2, max_length=32)] = Field(
        description="The models, two or more."
    )
    combine: str = Field(
        default="mean",
        min_length=1,
        description="mean, weighted (by each model's weight), max, min, a combiner registered with "
        "eventbus.models.register_combiner, or 'module:attr' of fn(outputs: list[Tensor], weights: list[float]) -> Tensor.",
    )
    input: str = Field(min_length=1, description="CEL: the event's input row.")
    output: TargetPath | dict[TargetPath, str] = Field(
        description="As for the model step; 'version' is a list, one per model."
    )
    timeout_s: Annotated[float, Field(gt=0, le=600)] = Field(
        default=30, description="Deadline of the calls."
    )

    @model_validator(mode="after")
    def _weights(self) -> EnsembleConfig:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            msg = f"ensemble lists model {dup!r} twice; list each model once (use 'weight' to count one more)"
            raise ValueError(msg)
        if self.combine == "weighted" and sum(m.weight for m in self.models) <= 0:
            msg = "combine: weighted needs at least one model with a weight above 0"
            raise ValueError(msg)
        return self


def pool_problems(steps: Sequence[Any], pools: Mapping[str, ModelPoolConfig]) -> list[str]:
    """Model steps naming a pool that ``spec.model_pools`` does not declare."""
    problems = []
    for step in steps:
        pool = getattr(step.options, "pool", None)
        if pool is None or pool in pools:
            continue
        close = difflib.get_close_matches(pool, sorted(pools), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        declared = ", ".join(sorted(pools)) or "none"
        problems.append(
            f"step {step.id!r}: unknown model pool {pool!r}{hint}; declared pools: {declared}; "
            f"declare it under spec.model_pools, e.g. model_pools: {{{pool}: "
            "{max_models_per_replica: 4}}"
        )
    return problems
