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
```
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

__all__ = [
    "EnsembleConfig",
    "EnsembleMemberConfig",
    "ModelServingConfig",
    "ModelStepConfig",
]

_MODEL = ConfigDict(extra="forbid", frozen=True)
ModelName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,47}$")]
ImportRef = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")]
TargetPath = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]+(\.[A-Za-z_][A-Za-z0-9_-]*)*$")]


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
    """Run each event's input through a model (``steps: [{id: ..., model: {...}}]``)."""

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
