"""Pipeline YAML, the step contract, the built-in step kinds and the step runner.

The step contract (:class:`Step`, :class:`StepContext`, :class:`StepResult`, :class:`Timer`,
:class:`Fired`) imports nothing else of the package, so a plugin may import it while the
pipeline models (built from the registry, plugins included) are not built yet; every other name
is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from eventbus.pipelines._step import Fired, Step, StepContext, StepResult, Timer

if TYPE_CHECKING:
    from eventbus.pipelines._build import build_step, pipeline_timers
    from eventbus.pipelines._config import (
        AutoscalingConfig,
        BatchConfig,
        ConvertConfig,
        DeliveryConfig,
        FilterDialect,
        FunctionStepConfig,
        MetadataConfig,
        PipelineConfig,
        PipelineSpecConfig,
        ReplicasConfig,
        ServingConfig,
        SinkConfig,
        SourceConfig,
        StepConfig,
        model_refs,
    )
    from eventbus.pipelines._loader import (
        Problem,
        load_pipeline,
        load_pipeline_text,
        validate_pipeline_text,
    )
    from eventbus.pipelines._runner import PipelineRunner
    from eventbus.pipelines.steps._convert import ConvertStep
    from eventbus.pipelines.steps._filter import FilterStep
    from eventbus.pipelines.steps._function import FunctionStep

__all__ = [
    "AutoscalingConfig",
    "BatchConfig",
    "ConvertConfig",
    "ConvertStep",
    "DeliveryConfig",
    "FilterDialect",
    "FilterStep",
    "Fired",
    "FunctionStep",
    "FunctionStepConfig",
    "MetadataConfig",
    "PipelineConfig",
    "PipelineRunner",
    "PipelineSpecConfig",
    "Problem",
    "ReplicasConfig",
    "ServingConfig",
    "SinkConfig",
    "SourceConfig",
    "Step",
    "StepConfig",
    "StepContext",
    "StepResult",
    "Timer",
    "build_step",
    "load_pipeline",
    "load_pipeline_text",
    "model_refs",
    "pipeline_timers",
    "validate_pipeline_text",
]

_LAZY = {
    "build_step": "_build",
    "pipeline_timers": "_build",
    "Problem": "_loader",
    "load_pipeline": "_loader",
    "load_pipeline_text": "_loader",
    "validate_pipeline_text": "_loader",
    "PipelineRunner": "_runner",
    "ConvertStep": "steps._convert",
    "FilterStep": "steps._filter",
    "FunctionStep": "steps._function",
}


def __getattr__(name: str) -> Any:
    if name in __all__:
        module = importlib.import_module(f"{__name__}.{_LAZY.get(name, '_config')}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
