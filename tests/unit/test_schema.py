"""The committed JSON Schema matches the models; examples validate against it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from eventbus.pipelines._schema import pipeline_schema, pipeline_schema_json

ROOT = Path(__file__).resolve().parents[2]


def test_committed_schema_is_current() -> None:
    committed = (ROOT / "eventbus.schema.json").read_text()
    assert committed == pipeline_schema_json(plugins=False), (
        "eventbus.schema.json is stale: run `make schema` and commit it"
    )


def test_examples_validate_against_schema() -> None:
    schema = pipeline_schema()
    files = [p for p in ROOT.glob("examples/**/*.yaml") if not p.name.endswith("_test.yaml")]
    assert files
    for f in files:
        jsonschema.validate(yaml.safe_load(f.read_text()), schema)


def test_schema_rejects_unknown_fields() -> None:
    doc = yaml.safe_load((ROOT / "examples/payments/payments.yaml").read_text())
    doc["spec"]["bogus"] = 1
    try:
        jsonschema.validate(doc, pipeline_schema())
    except jsonschema.ValidationError as exc:
        assert "bogus" in str(exc)
    else:
        raise AssertionError("the schema accepted an unknown field")
    assert json.loads(pipeline_schema_json())["title"].startswith("EventBus Pipeline")
