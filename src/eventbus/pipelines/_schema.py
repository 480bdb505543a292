"""The JSON Schema of pipeline YAML (``eventbus schema``), committed as ``eventbus.schema.json``."""

from __future__ import annotations

import json
from typing import Any

from eventbus.pipelines._config import PipelineConfig

__all__ = ["pipeline_schema", "pipeline_schema_json"]


def pipeline_schema() -> dict[str, Any]:
    """The JSON Schema of a pipeline document (aliases as written in YAML)."""
    schema = PipelineConfig.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "EventBus Pipeline (eventbus/v1)"
    return schema


def pipeline_schema_json() -> str:
    """The schema as stable, indented JSON text with a final newline."""
    return json.dumps(pipeline_schema(), indent=2, sort_keys=True) + "\n"
