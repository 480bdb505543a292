"""Pipeline YAML validation: every problem at once, with positions."""

from __future__ import annotations

import re
import textwrap

import pytest

from eventbus.errors import PipelineConfigError
from eventbus.pipelines import load_pipeline_text, validate_pipeline_text

GOOD = textwrap.dedent(
    """\
    apiVersion: eventbus/v1
    kind: Pipeline
    metadata: {name: orders}
    spec:
      sources:
        - kafka: {topic: orders}
      steps:
        - id: big
          filter: "data.amount > 10"
      sink: {kafka: {topic: out}}
    """
)


def problems(text: str) -> list[str]:
    config, found = validate_pipeline_text(text, "p.yaml")
    assert config is None
    return [str(p) for p in found]


def test_good_pipeline_loads() -> None:
    config = load_pipeline_text(GOOD, "p.yaml")
    assert config.name == "orders"
    assert config.spec.steps[0].template == "filter"
    assert config.spec.serving.batch.max_size == 2000


def test_every_problem_reported_at_once_with_positions() -> None:
    text = textwrap.dedent(
        """\
        apiVersion: eventbus/v1
        kind: Pipeline
        metadata: {name: orders}
        spec:
          sources:
            - kafka: {topic: orders}
          steps:
            - id: Bad-Id
              filter: "true"
              extra_field: 1
            - id: two
              joinn: {}
          sink: {kafka: {topic: out}}
        """
    )
    found = problems(text)
    assert "p.yaml:8:11: spec.steps[0].id: must match ^[a-z][a-z0-9_]*$; got 'Bad-Id'" in found
    assert any(
        re.match(r"p\.yaml:10:\d+: spec\.steps\[0\]\.extra_field: field not recognised", p)
        for p in found
    )
    assert any(
        p.startswith("p.yaml:12:") and "spec.steps[1].joinn: field not recognised" in p
        for p in found
    )
    assert len(found) >= 3


def test_unknown_field_gets_a_hint() -> None:
    found = problems(GOOD.replace("sink:", "sinc:"))
    assert any("spec.sinc: field not recognised (did you mean 'sink'?)" in p for p in found)
    assert any("spec.sink: required field is missing" in p for p in found)


def test_cel_syntax_error_points_into_the_expression() -> None:
    found = problems(GOOD.replace('"data.amount > 10"', '"data.amount >"'))
    assert len(found) == 1
    # the expression starts at column 19 (after the quote); the error is at its end
    assert found[0].startswith("p.yaml:9:")
    assert "spec.steps[0].filter: step 'big':" in found[0]
    assert "column" in found[0]


def test_cel_unknown_variable_hint() -> None:
    found = problems(GOOD.replace("data.amount > 10", "dta.amount > 10"))
    assert len(found) == 1
    assert "unknown variable 'dta' (did you mean 'data'?)" in found[0]


def test_missing_function_module_is_reported() -> None:
    text = GOOD.replace('filter: "data.amount > 10"', "function: no_such_module_xyz:fn")
    found = problems(text)
    assert len(found) == 1
    assert "cannot import module 'no_such_module_xyz'" in found[0]
    assert found[0].startswith("p.yaml:9:")


def test_yaml_syntax_error_has_position() -> None:
    found = problems("apiVersion: eventbus/v1\nkind: [Pipeline\n")
    assert len(found) == 1
    assert found[0].startswith("p.yaml:3:1: yaml:")


def test_not_a_mapping() -> None:
    found = problems("- 1\n- 2\n")
    assert found == [
        "p.yaml:1:1: document: a pipeline is a YAML mapping with apiVersion, kind, metadata, spec; got list"
    ]


def test_wrong_api_version() -> None:
    found = problems(GOOD.replace("eventbus/v1", "eventbus/v2"))
    assert found == ["p.yaml:1:13: apiVersion: must be 'eventbus/v1'; got 'eventbus/v2'"]


def test_duplicate_step_ids_and_two_templates() -> None:
    text = GOOD.replace(
        '      filter: "data.amount > 10"\n',
        '      filter: "data.amount > 10"\n    - id: big\n      filter: "true"\n      convert: {remove: [subject]}\n',
    )
    found = problems(text)
    from eventbus.pipelines import StepConfig

    # the built-in kinds in their order, then any installed plugin's (the example plugin's)
    kinds = ", ".join(StepConfig.kind_names)
    assert kinds.startswith("filter, convert, function, join, allocate, model, ensemble")
    assert any(f"step 'big' needs exactly one of {kinds}; got filter, convert" in p for p in found)


def test_load_raises_with_all_problems() -> None:
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_text(GOOD.replace("orders}", "Orders}"), "p.yaml")
    assert info.value.problems == [
        "p.yaml:3:18: metadata.name: must match ^[a-z][a-z0-9-]{0,47}$; got 'Orders'"
    ]
    assert str(info.value) == info.value.problems[0]


def test_name_may_not_take_a_model_application_name() -> None:
    # Serve apps: pipeline NAME -> eventbus-NAME, model X -> eventbus-model-X.
    found = problems(GOOD.replace("orders}", "model-fraud}"))
    assert found == [
        "p.yaml:3:18: metadata.name: must not start with 'model-' (its Serve application eventbus-model-fraud would "
        "clash with the one of model 'fraud'); got 'model-fraud'; rename the pipeline, e.g. 'fraud-pipeline'"
    ]
    assert (
        load_pipeline_text(GOOD.replace("orders}", "fraud-model}"), "p.yaml").name == "fraud-model"
    )


def test_replicas_bounds_checked() -> None:
    found = problems(GOOD + "  serving: {replicas: {min: 3, max: 2}}\n")
    assert any("replicas.min (3) is larger than replicas.max (2)" in p for p in found)


def test_linger_defaults_per_kind_of_source_and_an_explicit_value_applies_to_all() -> None:
    text = GOOD.replace("- kafka: {topic: orders}", "- kafka: {topic: orders}\n    - http: {}")
    config = load_pipeline_text(text, "p.yaml")
    kafka, ingress = config.consumed_sources
    assert ingress.topic != kafka.topic
    assert (config.linger_ms_of(kafka), config.linger_ms_of(ingress)) == (2, 25)
    config = load_pipeline_text(text + "  serving: {batch: {linger_ms: 7}}\n", "p.yaml")
    assert [config.linger_ms_of(s) for s in config.consumed_sources] == [7, 7]
    # the default survives the round trip through the stored document
    again = type(config).model_validate(load_pipeline_text(text, "p.yaml").to_document())
    assert again.linger_ms_of(again.consumed_sources[1]) == 25
