"""eventbus.testing: a pipeline in process from text, a file or a config; bad input named."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventbus import CloudEvent
from eventbus.errors import PipelineConfigError
from eventbus.pipelines import load_pipeline
from eventbus.testing import ListSink, MemorySource, run_pipeline

ROOT = Path(__file__).resolve().parents[2]
YAML = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: t}
spec:
  sources: [{kafka: {topic: a}}]
  steps:
    - {id: big, filter: "data.n > 1"}
    - {id: half, convert: {set: {data.h: "100 / (data.n - 3)"}}}
  sink: {kafka: {topic: b}}
"""


def events(n: int) -> list[CloudEvent]:
    return [CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"n": i}) for i in range(n)]


def test_outputs_dead_letters_and_drops_are_all_accounted_for() -> None:
    result = run_pipeline(YAML, events(6), max_batch=4)
    assert [e.data["h"] for e in result.outputs] == [-100, 100, 50]  # n = 2, 4, 5
    [dead] = result.dead_letters  # n = 3: division by zero
    assert dead.attributes["ebstep"] == "half" and dead.attributes["ebpipeline"] == "t"
    assert result.dropped == 2
    assert len(result.outcomes) == 6


def test_a_file_and_a_config_run_the_same(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(YAML)
    by_path = run_pipeline(path, events(6))
    by_config = run_pipeline(load_pipeline(path), events(6))
    assert [e.data for e in by_path.outputs] == [e.data for e in by_config.outputs]


def test_the_example_plugin_runs_in_process() -> None:
    result = run_pipeline(
        ROOT / "examples/plugin/cards.yaml",
        [CloudEvent.create(type="p", source="/s", data={"amount": 500, "card": "4000"})],
    )
    assert result.outputs[0].data == {"amount": 500, "card": "####"}


def test_bad_input_is_named() -> None:
    with pytest.raises(PipelineConfigError, match=r"spec.steps\[0\].id: must match"):
        run_pipeline(YAML.replace("id: big", "id: Big"), events(1))
    with pytest.raises(
        TypeError, match="run_pipeline takes a PipelineConfig, a path or YAML text; got int"
    ):
        run_pipeline(3, events(1))
    with pytest.raises(ValueError, match="max_batch must be at least 1; got 0"):

        async def dispatch(batch: list[CloudEvent]) -> list[object]:
            return []

        MemorySource([], dispatch, ListSink(), max_batch=0)  # type: ignore[arg-type]


def test_a_large_batch_goes_through_in_bounded_batches() -> None:
    result = run_pipeline(YAML, events(20_000), max_batch=2_000)
    assert len(result.outputs) + len(result.dead_letters) + result.dropped == 20_000
