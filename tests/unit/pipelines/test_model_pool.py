"""Model pools: the YAML's validation (hostile values included) and a pool step's per-event
model names, without Ray (nothing here reaches a pool)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from pydantic import ValidationError

from eventbus import CloudEvent
from eventbus.errors import ConfigError
from eventbus.eventing._outcome import Failure
from eventbus.pipelines import validate_pipeline_text
from eventbus.pipelines.steps._model_config import ModelPoolConfig, ModelStepConfig
from eventbus.pipelines.steps._model_pool import PoolModelStep


def _pipeline(
    step: str, pools: str = "{fraud: {max_models_per_replica: 2}}", name: str = "p"
) -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: eventbus/v1
        kind: Pipeline
        metadata: {{name: {name}}}
        spec:
          sources: [{{kafka: {{topic: in}}}}]
          model_pools: {pools}
          steps:
            - id: score
              model: {step}
          sink: {{kafka: {{topic: out}}}}
        """
    )


def _problems(text: str) -> dict[str, str]:
    config, problems = validate_pipeline_text(text, "p.yaml")
    assert config is None, "expected the pipeline to be rejected"
    return {p.path: str(p) for p in problems}


def test_a_valid_pool_pipeline_loads() -> None:
    text = _pipeline(
        "{pool: fraud, select: \"'fraud-' + data.region\", input: data.x, output: data.y}"
    )
    config, problems = validate_pipeline_text(text, "p.yaml")
    assert problems == [] and config is not None
    step = config.spec.steps[0].options
    assert (step.pool, step.select, step.name) == ("fraud", "'fraud-' + data.region", None)
    assert config.spec.model_pools["fraud"].max_models_per_replica == 2


def test_unknown_pool_is_named_with_the_declared_ones_and_a_suggestion() -> None:
    found = _problems(_pipeline("{pool: frud, name: fraud-eu, input: data.x, output: data.y}"))
    assert list(found.values()) == [
        "p.yaml:5:3: spec: step 'score': unknown model pool 'frud' (did you mean 'fraud'?); "
        "declared pools: fraud; declare it under spec.model_pools, e.g. model_pools: "
        "{frud: {max_models_per_replica: 4}}"
    ]
    found = _problems(_pipeline("{pool: x, name: a, input: data.x, output: data.y}", pools="{}"))
    assert "unknown model pool 'x'; declared pools: none" in next(iter(found.values()))


@pytest.mark.parametrize(
    ("model", "expect"),
    [
        ("{pool: fraud, name: '', input: data.x, output: data.y}", "must match"),
        ("{pool: fraud, select: '', input: data.x, output: data.y}", "at least 1 character"),
        (
            "{pool: fraud, select: \"'" + "a" * 5000 + "'\", input: data.x, output: data.y}",
            "at most 4096 characters",
        ),
        ("{pool: fraud, input: data.x, output: data.y}", "exactly one of 'name'"),
        (
            "{pool: fraud, name: a, select: \"'a'\", input: data.x, output: data.y}",
            "got both",
        ),
        ("{select: \"'a'\", input: data.x, output: data.y}", "without 'pool'"),
        ("{input: data.x, output: data.y}", "give the model's registry 'name'"),
        (
            "{pool: fraud, name: a, path: a.pt2, input: data.x, output: data.y}",
            "remove 'path'",
        ),
        ("{pool: Fraud!, name: a, input: data.x, output: data.y}", "must match"),
        ("{pool: fraud, select: 'data.region +', input: data.x, output: data.y}", "select"),
        (
            "{pool: fraud, select: \"'f-' + dat.region\", input: data.x, output: data.y}",
            "unknown variable",
        ),
    ],
)
def test_hostile_step_configs_are_rejected_with_the_reason(model: str, expect: str) -> None:
    found = _problems(_pipeline(model))
    assert any(expect in v for v in found.values()), found
    assert all(k.startswith("spec") for k in found)


@pytest.mark.parametrize(
    ("size", "expect"),
    [
        (0, "greater than or equal to 1"),
        (-3, "greater than or equal to 1"),
        (10**12, "less than or equal to 1024"),
        ("two", "valid integer"),
        (2.5, "valid integer"),
    ],
)
def test_pool_sizes_out_of_range_are_rejected(size: Any, expect: str) -> None:
    with pytest.raises(ValidationError, match=expect):
        ModelPoolConfig.model_validate({"max_models_per_replica": size})
    found = _problems(
        _pipeline(
            "{pool: fraud, name: a, input: data.x, output: data.y}",
            pools=f"{{fraud: {{max_models_per_replica: {size!r}}}}}",
        )
    )
    assert "spec.model_pools.fraud.max_models_per_replica" in found, found


def test_too_many_pools_and_a_bad_pool_name_are_rejected() -> None:
    many = "{" + ", ".join(f"p{i}: {{}}" for i in range(65)) + "}"
    found = _problems(_pipeline("{pool: p1, name: a, input: data.x, output: data.y}", pools=many))
    assert any("at most 64" in v for v in found.values()), found
    found = _problems(
        _pipeline("{pool: a, name: a, input: data.x, output: data.y}", pools="{A_b: {}}")
    )
    assert any("must match" in v for v in found.values()), found


def test_a_pipeline_name_cannot_take_a_pool_application_name() -> None:
    found = _problems(
        _pipeline("{pool: fraud, name: a, input: data.x, output: data.y}", name="pool-fraud")
    )
    assert "would clash with the one of model pool 'fraud'" in found["metadata.name"]


def _step(select: str) -> PoolModelStep:
    spec = ModelStepConfig.model_validate(
        {"pool": "fraud", "select": select, "input": "[1.0]", "output": "data.y"}
    )
    return PoolModelStep("score", spec, remote=True)


def _event(i: int, data: Any) -> CloudEvent:
    return CloudEvent.create(type="t", source="/s", id=f"e{i}", data=data)


def test_select_results_that_are_not_model_names_fail_their_own_event() -> None:
    step = _step("data.m")
    values: list[Any] = ["fraud-eu", 3, ["a"], None, "", "x" * 10_000, "Fraud", {"a": 1}]
    events = [_event(i, {"m": v}) for i, v in enumerate(values)]
    names = step.names(events)
    assert names[0] == "fraud-eu" and names[1:] == [None] * (len(values) - 1)
    assert "gave 3 (int) for event 'e1', not a model name" in step.name_errors[1]
    assert "(list)" in step.name_errors[2] and "(null)" in step.name_errors[3]
    assert "gave '' for event 'e4', not a model name" in step.name_errors[4]
    assert len(step.name_errors[5]) < 300, "a huge value is shortened in the reason"
    assert "not a model name" in step.name_errors[6]
    missing = step.names([_event(9, {"other": 1})])
    assert missing == [None] and "failed on event 'e9'" in step.name_errors[0]


def test_a_batch_of_unnamed_events_fails_each_without_calling_the_pool() -> None:
    step = _step("data.m")
    results = step.process([_event(0, {"m": 1}), _event(1, {}), _event(2, {"m": "UP"})])
    assert all(isinstance(r, Failure) for r in results)
    assert [r.error_type for r in results] == ["ModelSelectError"] * 3  # type: ignore[union-attr]
    assert step.errors == 3 and step.stats()["pool_loads"] == 0


def test_a_static_name_needs_no_select_and_pools_do_not_run_in_process() -> None:
    spec = ModelStepConfig.model_validate(
        {"pool": "fraud", "name": "fraud-eu", "input": "[1.0]", "output": "data.y"}
    )
    step = PoolModelStep("score", spec, remote=True)
    assert step.names([_event(0, {}), _event(1, {})]) == ["fraud-eu", "fraud-eu"]
    with pytest.raises(ConfigError, match="pool 'fraud' serves models from the registry"):
        PoolModelStep("score", spec, remote=False)
