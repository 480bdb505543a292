"""The kind-keyed configs of a pipeline: ``SourceConfig``, ``SinkConfig`` and ``StepConfig``,
pydantic models built from the registries (one optional field per registered kind, built-ins
then plugins, and an "exactly one" validator naming the kinds)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model, model_validator

from eventbus import registry

__all__ = ["SinkConfig", "SourceConfig", "StepConfig", "model_refs"]

_MODEL = ConfigDict(extra="forbid", frozen=True)

StepId = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")]


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
