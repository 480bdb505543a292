"""The deploy-time check of Avro sinks names the YAML path and the fix when the registry
cannot be reached (an outage at deploy refuses the deploy; it is not skipped)."""

from __future__ import annotations

import pytest

from eventbus.errors import DeployError
from eventbus.pipelines import load_pipeline_text
from eventbus.serving._schema_checks import check_sink_schemas, sink_schema_problems

TEXT = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: p}
spec:
  sources: [{kafka: {topic: in}}]
  sink:
    kafka:
      topic: out
      value_format: avro
      schema_registry_url: http://127.0.0.1:1/registry
      subject: out-value
      value_schema: {type: record, name: R, fields: [{name: a, type: long}]}
"""


def test_an_unreachable_registry_refuses_the_deploy_by_path() -> None:
    config = load_pipeline_text(TEXT, "p.yaml")
    (problem,) = sink_schema_problems(config)
    assert problem.startswith("spec.sink.kafka.schema_registry_url: the schema registry at ")
    assert problem.endswith("start the registry or fix the URL")
    with pytest.raises(DeployError, match="pipeline 'p' could not be deployed:\nspec.sink"):
        check_sink_schemas(config)


def test_json_sinks_are_not_checked() -> None:
    text = TEXT.split("      value_format")[0]
    assert sink_schema_problems(load_pipeline_text(text, "p.yaml")) == []


def test_an_avro_dead_letter_topic_is_refused() -> None:
    from eventbus.pipelines import validate_pipeline_text

    sink = TEXT.split("  sink:\n")[1]
    text = TEXT + "  dead_letter:\n" + sink
    _, problems = validate_pipeline_text(text, "p.yaml")
    (problem,) = problems
    assert "spec.dead_letter" in str(problem) and "remove value_format" in str(problem)
