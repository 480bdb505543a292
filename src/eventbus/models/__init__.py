"""Models as pipeline stages: artifacts, the registry of versions in Redis, validation,
combiners of ensembles. The Ray Serve deployment is in ``eventbus.models._serve`` (imports Ray).

Importing this package imports neither torch nor Ray.
"""

from __future__ import annotations

from eventbus.models._artifact import (
    LoadedModel,
    detect_format,
    load_model,
    pick_device,
    read_artifact,
)
from eventbus.models._combine import combiner, register_combiner
from eventbus.models._registry import ModelRegistry
from eventbus.models._validate import ValidationReport, accuracy, validate_candidate
from eventbus.models._watch import new_model_files

__all__ = [
    "LoadedModel",
    "ModelRegistry",
    "ValidationReport",
    "accuracy",
    "combiner",
    "detect_format",
    "load_model",
    "new_model_files",
    "pick_device",
    "read_artifact",
    "register_combiner",
    "validate_candidate",
]
