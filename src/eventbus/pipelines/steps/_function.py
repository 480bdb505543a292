"""The ``function`` step: a user's Python function (``module:attr``), per event or batch."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, StringConstraints

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.functions._function import function_spec, resolve_function
from eventbus.pipelines._step import Step, StepContext, StepResult
from eventbus.pipelines.steps._values import CONFIG
from eventbus.registry import steps

__all__ = ["FunctionRef", "FunctionStep", "FunctionStepConfig"]

#: ``package.module:function``
FunctionRef = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")]


class FunctionStepConfig(BaseModel):
    """A registered Python function, by import path."""

    model_config = CONFIG
    ref: FunctionRef = Field(description="Import path 'package.module:function'.")
    batch: bool | None = Field(
        default=None,
        description="Override the function's own batch flag (from @eventbus.function).",
    )


class FunctionStep(Step):
    """Run a user function. A per-event function is called per event; a batch function once
    per batch, and, when the batch call raises, once per event so that only the failing
    events fail."""

    kind = "function"

    def __init__(self, step_id: str, ref: str, *, batch: bool | None = None) -> None:
        super().__init__(step_id)
        self.ref = ref
        self._fn = resolve_function(ref)
        spec = function_spec(self._fn)
        self.batch = spec.batch if batch is None else batch

    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        if self.batch and events:
            try:
                results = self._fn(events)
                if not isinstance(results, list) or len(results) != len(events):
                    got = (
                        f"{type(results).__name__} of {len(results)}"
                        if isinstance(results, list)
                        else type(results).__name__
                    )
                    msg = (
                        f"batch function {self.ref!r} returned {got} results for {len(events)} events; "
                        "a batch function returns a list with one result per input event"
                    )
                    raise TypeError(msg)
                return [self._check(r) for r in results]
            except Exception:  # noqa: BLE001, S110 - isolate the failing events below
                pass
        return [self._one(e) for e in events]

    def _one(self, e: CloudEvent) -> StepResult:
        # One try: retries happen at the source (RetryPolicy), off the replica's thread, so a
        # failing event's backoff never holds up its batch-mates.
        try:
            result = self._fn([e])[0] if self.batch else self._fn(e)
            return self._check(result)
        except Exception as exc:  # noqa: BLE001 - user code: fail only this event
            return self._failure(exc)

    def _check(self, result: Any) -> StepResult:
        if result is None or type(result) is CloudEvent:
            return result
        if isinstance(result, (list, tuple)) and all(type(r) is CloudEvent for r in result):
            return list(result)
        if isinstance(result, Failure):
            return result
        msg = (
            f"function {self.ref!r} returned {type(result).__name__}; return a CloudEvent, None "
            "(drop the event) or a list of CloudEvents"
        )
        raise TypeError(msg)


def function_ref(config: str | FunctionStepConfig) -> str:
    """The ``module:attr`` reference of a function step's config."""
    return config.ref if isinstance(config, FunctionStepConfig) else str(config)


def _imports(raw: Any) -> list[tuple[tuple[int | str, ...], str]]:
    ref = raw.get("ref") if isinstance(raw, dict) else raw
    return [((), ref)] if isinstance(ref, str) else []


@steps.register(
    "function",
    config=FunctionRef | FunctionStepConfig,
    description="A Python function 'package.module:function'.",
    imports=_imports,
    example="eventbus.testing:passthrough",
)
def build_function(
    step_id: str, config: str | FunctionStepConfig, context: StepContext
) -> FunctionStep:
    """A function step."""
    batch = config.batch if isinstance(config, FunctionStepConfig) else None
    return FunctionStep(step_id, function_ref(config), batch=batch)
