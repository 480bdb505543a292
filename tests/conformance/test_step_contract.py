"""The step contract's behaviour suite: every registered step kind, built-ins and plugins
alike (the example plugin's ``redact`` included), built from its declared ``example`` config
and held to what the runner and the replicas rely on."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from eventbus import CloudEvent, Failure
from eventbus.pipelines import PipelineRunner, Step, StepConfig, Timer, build_step
from eventbus.pipelines._schema import pipeline_schema
from eventbus.pipelines._step import ERRORED
from eventbus.registry import Registration, steps

KINDS = steps.names()


def _example(kind: Registration[Any], folder: Path) -> Any:
    example = kind.trait("example")
    assert example is not None, (
        f"step kind {kind.name!r} ({kind.module}) declares no example= trait; the behaviour "
        "suite builds every kind from it"
    )
    return example(folder) if callable(example) else example


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Registration[Any]:
    return steps.get(request.param)


@pytest.fixture
def built(kind: Registration[Any], tmp_path: Path) -> tuple[StepConfig, Step]:
    config = StepConfig.model_validate({"id": "s", kind.name: _example(kind, tmp_path)})
    return config, build_step(config, pipeline="suite", base_dirs=[str(tmp_path)])


def _events(n: int) -> list[CloudEvent]:
    kinds = ("order", "payment")
    return [
        CloudEvent.create(
            type=kinds[i % 2], source="/suite", id=f"e{i}", data={"id": i // 2, "amount": i}
        )
        for i in range(n)
    ]


def _hostile() -> list[CloudEvent]:
    """Events the example configs do not expect: no data, bytes, a list, deep nesting."""
    deep: Any = 1
    for _ in range(200):
        deep = {"a": deep}
    return [
        CloudEvent.create(type="x", source="/suite", id="h0", data=None),
        CloudEvent.create(type="x", source="/suite", id="h1", data=b"\x00\xff"),
        CloudEvent.create(type="x", source="/suite", id="h2", data=[1, 2, 3]),
        CloudEvent.create(type="x", source="/suite", id="h3", data={"deep": deep}),
        CloudEvent.create(type="x", source="/suite", id="h4", data={"amount": "NaN" * 10_000}),
    ]


def _valid_result(result: Any) -> bool:
    if result is None or result is ERRORED or type(result) is CloudEvent:
        return True
    if isinstance(result, Failure):
        return True
    return isinstance(result, list) and all(type(r) is CloudEvent for r in result)


def test_registration_is_complete(kind: Registration[Any]) -> None:
    assert kind.description, f"{kind.name}: give the kind a description"
    assert kind.name in StepConfig.model_fields
    step_def = pipeline_schema()["$defs"]["StepConfig"]["properties"]
    assert kind.name in step_def, f"{kind.name} is missing from the JSON Schema"


def test_builds_a_step_of_its_kind(built: tuple[StepConfig, Step], kind: Registration[Any]) -> None:
    config, step = built
    assert isinstance(step, Step)
    assert step.kind == kind.name == config.kind
    assert step.id == "s"
    assert step.pure is bool(kind.trait("pure", False)), "the pure trait and Step.pure agree"


@pytest.mark.parametrize("n", [0, 1, 7, 2000])
def test_one_result_per_event_in_order(built: tuple[StepConfig, Step], n: int) -> None:
    _, step = built
    events = _events(n)
    results = step.process(events)
    assert len(results) == n
    assert all(_valid_result(r) for r in results)


def test_input_events_are_not_changed(built: tuple[StepConfig, Step]) -> None:
    _, step = built
    events = _events(20) + _hostile()
    before = [(dict(e.attributes), copy.deepcopy(e.data)) for e in events]
    step.process(events)
    assert [(dict(e.attributes), e.data) for e in events] == before


def test_hostile_events_never_raise(built: tuple[StepConfig, Step]) -> None:
    _, step = built
    events = _hostile()
    results = step.process(events)
    assert len(results) == len(events)
    assert all(_valid_result(r) for r in results)


def test_stats_and_timers_are_well_formed(built: tuple[StepConfig, Step]) -> None:
    _, step = built
    step.process(_events(4))
    stats = step.stats()
    assert stats is None or isinstance(json.loads(json.dumps(stats)), dict)
    timers = step.timers()
    assert isinstance(timers, list) and all(isinstance(t, Timer) for t in timers)
    for t in timers:
        fired = t.fire()
        if fired is not None:
            t.ack(fired)


def test_runs_in_a_pipeline_and_counts_every_event(kind: Registration[Any], tmp_path: Path) -> None:
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "suite"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [{"id": "s", kind.name: _example(kind, tmp_path)}],
            "sink": {"kafka": {"topic": "out"}},
        },
    }
    from eventbus.pipelines import PipelineConfig

    runner = PipelineRunner(PipelineConfig.model_validate(doc), base_dirs=[str(tmp_path)])
    events = _events(10) + _hostile()
    outcomes = runner.run(events)
    assert len(outcomes) == len(events)
    counters = runner.metrics()["steps"]["s"]
    assert counters["template"] == kind.name
    assert counters["in"] == len(events)
    assert all(isinstance(o, (list, Failure)) for o in outcomes)
