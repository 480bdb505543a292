"""Pipeline YAML, step templates and the step runner."""

from __future__ import annotations

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
)
from eventbus.pipelines._loader import (
    Problem,
    load_pipeline,
    load_pipeline_text,
    validate_pipeline_text,
)
from eventbus.pipelines._runner import PipelineRunner
from eventbus.pipelines._steps import ConvertStep, FilterStep, FunctionStep, Step, build_step

__all__ = [
    "AutoscalingConfig",
    "BatchConfig",
    "ConvertConfig",
    "ConvertStep",
    "DeliveryConfig",
    "FilterDialect",
    "FilterStep",
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
    "build_step",
    "load_pipeline",
    "load_pipeline_text",
    "validate_pipeline_text",
]
