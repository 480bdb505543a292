"""Pipeline YAML validation: every problem at once, with positions."""

from __future__ import annotations

import pathlib
import re
import textwrap

import pytest
import yaml

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
    assert kinds.startswith("filter, convert, function, join, aggregate, allocate, model, ensemble")
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


# -- YAML anchors and aliases ---------------------------------------------------------------

_BOMB_LEVELS = "".join(
    f"  l{n}: &l{n} [{', '.join([f'{{any: *l{n - 1}}}'] * 8)}]\n" for n in range(1, 7)
)
# A "billion laughs": 8**7 leaves reached through aliases from ~1 KB of YAML. Before aliases
# were refused, validating this took ~27 s (pydantic walked every expanded filter).
BOMB = (
    "apiVersion: eventbus/v1\nkind: Pipeline\nmetadata: {name: bomb}\nspec:\n"
    f"  l0: &l0 [{', '.join(['{exact: {type: x}}'] * 8)}]\n"
    + _BOMB_LEVELS
    + "  sources: [{kafka: {topic: t}}]\n"
    "  steps:\n    - id: a\n      filter: {any: *l6}\n"
    "  sink: {kafka: {topic: out}}\n"
)


def test_alias_bomb_is_refused_fast_with_a_position() -> None:
    import time

    started = time.perf_counter()
    found = problems(BOMB)
    elapsed = time.perf_counter() - started
    # milliseconds when refused; expanding the bomb takes minutes (or all the memory)
    assert elapsed < 10, f"validating the alias bomb took {elapsed:.2f} s"
    assert found == [
        "p.yaml:5:7: yaml: anchor &l0: YAML anchors and aliases are not allowed in EventBus "
        "pipeline and test files (an alias can expand exponentially); write the value out in "
        "full where it is used"
    ]


def test_ordinary_anchor_use_gets_a_clear_error() -> None:
    text = GOOD.replace(
        "  sink: {kafka: {topic: out}}\n",
        "  sink: &out {kafka: {topic: out}}\n  dead_letter: *out\n",
    )
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_text(text, "p.yaml")
    assert str(info.value).splitlines() == [
        "p.yaml:10:9: yaml: anchor &out: YAML anchors and aliases are not allowed in EventBus "
        "pipeline and test files (an alias can expand exponentially); write the value out in "
        "full where it is used"
    ]


def test_alias_without_its_anchor_named_at_the_alias() -> None:
    from eventbus.pipelines._yaml import load_yaml

    with pytest.raises(yaml.MarkedYAMLError, match=re.escape("alias *nowhere: YAML")) as info:
        load_yaml("a: 1\nb: *nowhere\n", "p.yaml")
    mark = info.value.problem_mark
    assert mark is not None
    assert (mark.name, mark.line + 1, mark.column + 1) == ("p.yaml", 2, 4)


def test_test_case_files_refuse_aliases_too(tmp_path: pathlib.Path) -> None:
    from eventbus.errors import ConfigError
    from eventbus.pipelines._testing import run_test_file

    (tmp_path / "p.yaml").write_text(GOOD)
    case = tmp_path / "p_test.yaml"
    case.write_text("tests:\n  - input: &in [{id: '1', data: {amount: 20}}]\n  - input: *in\n")
    with pytest.raises(ConfigError, match=re.escape(f"{case}:2:12: yaml: anchor &in: YAML")):
        run_test_file(case)
