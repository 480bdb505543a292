"""The JSON Schema of pipeline YAML (``eventbus schema``), committed as ``eventbus.schema.json``.

The schema is a product of the registries: every step, source and sink kind, plugins
included. The committed file holds the built-in kinds only (``plugins=False``), so it does
not depend on what happens to be installed where it is generated.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from eventbus.pipelines._config import PipelineConfig
from eventbus.registry import all_registries

__all__ = ["pipeline_schema", "pipeline_schema_json"]

_KIND_DEFS = {"step": "StepConfig", "source": "SourceConfig", "sink": "SinkConfig"}


def pipeline_schema(*, plugins: bool = True) -> dict[str, Any]:
    """The JSON Schema of a pipeline document (aliases as written in YAML).

    Args:
        plugins: include the kinds that plugins registered.
    """
    schema = PipelineConfig.model_json_schema(by_alias=True)
    if not plugins:
        _drop_plugin_kinds(schema)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "EventBus Pipeline (eventbus/v1)"
    return schema


def pipeline_schema_json(*, plugins: bool = True) -> str:
    """The schema as stable, indented JSON text with a final newline."""
    return json.dumps(pipeline_schema(plugins=plugins), indent=2, sort_keys=True) + "\n"


def _drop_plugin_kinds(schema: dict[str, Any]) -> None:
    defs = schema.get("$defs", {})
    for family, kinds in all_registries().items():
        definition = defs.get(_KIND_DEFS[family], {})
        for reg in kinds:
            if reg.origin == "builtin":
                continue
            definition.get("properties", {}).pop(reg.name, None)
            if isinstance(reg.config, type) and issubclass(reg.config, BaseModel):
                defs.pop(reg.config.__name__, None)
    _drop_unreferenced(schema)


def _drop_unreferenced(schema: dict[str, Any]) -> None:
    defs = schema.get("$defs", {})
    while True:
        text = json.dumps({k: v for k, v in schema.items() if k != "$defs"}) + json.dumps(defs)
        unused = [name for name in defs if f'"#/$defs/{name}"' not in text]
        if not unused:
            return
        for name in unused:
            defs.pop(name)
