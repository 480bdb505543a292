"""Building a pipeline's runtime steps from their configs, through the step registry."""

from __future__ import annotations

from typing import Any

from eventbus.cel import CELError
from eventbus.errors import ConfigError, EventBusError
from eventbus.pipelines._config import PipelineConfig, StepConfig
from eventbus.pipelines._step import Step, StepContext, Timer
from eventbus.registry import steps

__all__ = ["build_step", "pipeline_timers"]


def build_step(
    step: StepConfig,
    *,
    pipeline: str = "",
    redis_url: str | None = None,
    base_dirs: list[str] | None = None,
    dedupe_window_s: float | None = None,
    exactly_once: bool = False,
) -> Step:
    """Build the runtime step of a step config with its kind's factory (compiling
    expressions, importing functions, connecting to state).

    Args:
        step: the step's config.
        pipeline: the pipeline's name (state keys).
        redis_url: where stateful steps keep state; None: in memory, in process.
        base_dirs: where relative data files (an allocate catalogue, a model file) are read.
        dedupe_window_s: the pipeline's dedupe window (see :class:`StepContext`).
        exactly_once: the pipeline's guarantee is exactly_once (see :class:`StepContext`).

    Raises:
        ConfigError: the kind's factory raised something unexpected (EventBus, CEL and
            value errors pass as they are).
        TypeError: the kind's factory did not return a :class:`Step`.
    """
    kind = steps.get(step.kind)
    context = StepContext(
        pipeline=pipeline,
        redis_url=redis_url,
        base_dirs=list(base_dirs or []),
        dedupe_window_s=dedupe_window_s,
        exactly_once=exactly_once,
    )
    try:
        built: Any = kind.factory(step.id, step.options, context)
    except (EventBusError, CELError, ValueError):
        raise  # the config's own problems (a bad expression, a missing file), as they are
    except Exception as exc:  # a plugin's bug: name the step, the kind and where it comes from
        msg = (
            f"step {step.id!r} of kind {kind.name!r} ({kind.origin}: {kind.module}) could not "
            f"be built: {type(exc).__name__}: {exc}"
        )
        raise ConfigError(msg) from exc
    if not isinstance(built, Step):
        msg = (
            f"step kind {kind.name!r} ({kind.module}) built {type(built).__name__} for step "
            f"{step.id!r}; a step factory returns an eventbus.pipelines.Step"
        )
        raise TypeError(msg)
    return built


def pipeline_timers(config: PipelineConfig, redis_url: str | None) -> list[Timer]:
    """The timers of a pipeline's steps, building only the steps of kinds that declare
    timers (``timers=True``): a source actor runs them without the other steps."""
    out: list[Timer] = []
    for k, s in enumerate(config.spec.steps):
        if steps.get(s.kind).trait("timers", False):
            eos = config.spec.delivery.guarantee == "exactly_once"
            built = build_step(s, pipeline=config.name, redis_url=redis_url, exactly_once=eos)
            for timer in built.timers():
                timer.step_index = k
                out.append(timer)
    return out
