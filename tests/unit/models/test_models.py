"""Model and ensemble steps in process, artifacts, validation (no Ray, no Redis)."""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import CloudEvent, Failure
from eventbus.errors import ConfigError, ModelError
from eventbus.models import (
    accuracy,
    detect_format,
    load_model,
    new_model_files,
    pick_device,
    register_combiner,
    validate_candidate,
)
from eventbus.pipelines import StepConfig, build_step
from eventbus.pipelines._loader import validate_pipeline_text
from tests.unit.models.factories import mlp

ROOT = Path(__file__).resolve().parents[3]


def _save(fmt: str, module: torch.nn.Module, path: Path) -> Path:
    x = torch.randn(3, 4)
    if fmt == "export":
        ep = torch.export.export(module, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(ep, path)
    elif fmt == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(torch.jit.script(module), path)
    else:
        torch.save(module.state_dict(), path)
    return path


def _events(rows: list[Any]) -> list[CloudEvent]:
    return [
        CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"x": r})
        for i, r in enumerate(rows)
    ]


@pytest.mark.parametrize("fmt", ["export", "torchscript", "state_dict"])
def test_model_step_equals_direct_torch(fmt: str, tmp_path: Path) -> None:
    module = mlp().eval()
    path = _save(fmt, module, tmp_path / f"m.{fmt}")
    spec: dict[str, Any] = {"name": "m", "path": str(path), "input": "data.x", "output": "data.y"}
    if fmt == "state_dict":
        spec["factory"] = "tests.unit.models.factories:mlp"
    step = build_step(StepConfig.model_validate({"id": "score", "model": spec}))
    rows = torch.randn(50, 4).tolist()
    results = step.process(_events(rows))
    with torch.no_grad():
        expect = module(torch.tensor(rows, dtype=torch.float32))
    got = torch.tensor([r.data["y"] for r in results])  # type: ignore[union-attr]
    assert got.shape == (50, 2)
    assert torch.allclose(got, expect, atol=1e-5)
    assert detect_format(path.read_bytes(), "x:y") == fmt


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("fmt", ["export", "torchscript", "state_dict"])
def test_a_model_loads_on_the_gpu_and_answers_as_on_the_cpu(fmt: str, tmp_path: Path) -> None:
    # the model step loads on pick_device(): CUDA where torch sees a GPU
    blob = _save(fmt, mlp().eval(), tmp_path / f"m.{fmt}").read_bytes()
    factory = "tests.unit.models.factories:mlp" if fmt == "state_dict" else None
    gpu = load_model(blob, factory=factory, device=pick_device())
    cpu = load_model(blob, factory=factory, device="cpu")
    assert gpu.device == "cuda"
    x = torch.randn(256, 4)
    got = gpu(x)
    assert got.device.type == "cpu"  # handed back to the step on the CPU
    assert torch.allclose(got, cpu(x), atol=1e-5)


def test_bad_inputs_fail_only_their_event(tmp_path: Path) -> None:
    path = _save("export", mlp().eval(), tmp_path / "m.pt2")
    step = build_step(
        StepConfig.model_validate(
            {
                "id": "score",
                "model": {"name": "m", "path": str(path), "input": "data.x", "output": "data.y"},
            }
        )
    )
    results = step.process(
        _events([[1, 2, 3, 4], [1, 2], "abc", [[1, 2], [3, 4]], [0.5, 0.5, 0.5, 0.5]])
    )
    assert [type(r).__name__ for r in results] == [
        "CloudEvent",
        "Failure",
        "Failure",
        "Failure",
        "CloudEvent",
    ]
    f = results[1]
    assert isinstance(f, Failure) and f.step == "score"
    assert "input of event 'e1' has shape (2,); model 'm' takes rows of shape (4,)" in f.message
    assert "is not a list of numbers" in results[2].message  # type: ignore[union-attr]


def test_output_mapping_sees_output_version_and_event(tmp_path: Path) -> None:
    path = _save("export", mlp().eval(), tmp_path / "m.pt2")
    output = {
        "data.best": "output[0] > output[1] ? 'a' : 'b'",
        "data.v": "version",
        "subject": "id + '-scored'",
    }
    step = build_step(
        StepConfig.model_validate(
            {
                "id": "score",
                "model": {"name": "m", "path": str(path), "input": "data.x", "output": output},
            }
        )
    )
    [res] = step.process(_events([[1, 2, 3, 4]]))
    assert isinstance(res, CloudEvent)
    with torch.no_grad():
        y = mlp()(torch.tensor([[1.0, 2, 3, 4]]))[0]
    assert res.data["best"] == ("a" if y[0] > y[1] else "b")
    assert res.data["v"] == 0 and res.attributes["subject"] == "e0-scored"
    assert res.data["x"] == [1, 2, 3, 4]


def test_ensemble_combines(tmp_path: Path) -> None:
    a = _save("export", mlp().eval(), tmp_path / "a.pt2")
    torch.manual_seed(7)
    other = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
    b = _save("torchscript", other, tmp_path / "b.pt")

    @register_combiner("first_of")
    def first_of(outputs: list[Any], weights: list[float]) -> Any:
        return outputs[0]

    rows = torch.randn(10, 4)
    with torch.no_grad():
        ya, yb = mlp()(rows), other(rows)
    for combine, expect in (
        ("mean", (ya + yb) / 2),
        ("weighted", 0.75 * ya + 0.25 * yb),
        ("max", torch.maximum(ya, yb)),
        ("first_of", ya),
        ("tests.unit.models.factories:first_output", ya),
    ):
        cfg = {
            "models": [{"name": "a", "path": str(a), "weight": 3}, {"name": "b", "path": str(b)}],
            "combine": combine,
            "input": "data.x",
            "output": "data.y",
        }
        step = build_step(StepConfig.model_validate({"id": "ens", "ensemble": cfg}))
        got = torch.tensor([r.data["y"] for r in step.process(_events(rows.tolist()))])  # type: ignore[union-attr]
        assert torch.allclose(got, expect, atol=1e-5), combine


def test_config_errors() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape("model 'm': 'factory' builds the module for the state_dict in 'path'"),
    ):
        StepConfig.model_validate(
            {
                "id": "s",
                "model": {"name": "m", "factory": "a:b", "input": "data.x", "output": "data.y"},
            }
        )
    with pytest.raises(ValueError, match=re.escape("ensemble lists model 'a' twice")):
        StepConfig.model_validate(
            {
                "id": "s",
                "ensemble": {
                    "models": [{"name": "a"}, {"name": "a"}],
                    "input": "data.x",
                    "output": "data.y",
                },
            }
        )
    cfg = StepConfig.model_validate(
        {
            "id": "s",
            "ensemble": {
                "models": [{"name": "a", "path": "x"}, {"name": "b", "path": "y"}],
                "combine": "median",
                "input": "data.x",
                "output": "data.y",
            },
        }
    )
    with pytest.raises(
        ConfigError,
        match=re.escape("unknown ensemble combiner 'median'; use one of mean, weighted, max, min"),
    ):
        build_step(cfg)
    no_path = StepConfig.model_validate(
        {"id": "s", "model": {"name": "m", "input": "data.x", "output": "data.y"}}
    )
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "model 'm' runs in process here (eventbus test) and needs its artifact: add 'path:'"
        ),
    ):
        build_step(no_path)


def test_loader_reports_model_expressions_by_position() -> None:
    text = """apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: p}
spec:
  sources: [{kafka: {topic: t}}]
  steps:
    - id: score
      model:
        name: m
        input: data.x +
        output: {data.y: "output[0] *", data.z: "version + 1"}
  sink: {kafka: {topic: o}}
"""
    _, problems = validate_pipeline_text(text, "p.yaml")
    shown = [str(p) for p in problems]
    assert any(s.startswith("p.yaml:10:") and "spec.steps[0].model.input" in s for s in shown), (
        shown
    )
    assert any(
        s.startswith("p.yaml:11:")
        and "spec.steps[0].model.output.data.y: step 'score': syntax error" in s
        for s in shown
    ), shown
    assert len(shown) == 2


def test_artifact_errors(tmp_path: Path) -> None:
    with pytest.raises(
        ModelError, match=re.escape("the model file is not a torch artifact (not a zip archive)")
    ):
        load_model(b"not a model")
    buf = io.BytesIO()
    torch.save(mlp().state_dict(), buf)
    with pytest.raises(
        ModelError,
        match=re.escape(
            "holds a state_dict (torch.save); give the factory that builds its module: --factory module:attr"
        ),
    ):
        load_model(buf.getvalue())
    with pytest.raises(
        ModelError, match=re.escape("model factory 'nowhere.at_all:build' cannot be imported")
    ):
        load_model(buf.getvalue(), factory="nowhere.at_all:build")
    wrong = io.BytesIO()
    torch.save(torch.nn.Linear(3, 1).state_dict(), wrong)
    with pytest.raises(ModelError, match="does not load as a state_dict model: RuntimeError"):
        load_model(wrong.getvalue(), factory="tests.unit.models.factories:mlp")


class _Nan(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full((x.shape[0], 2), float("nan"))


def test_validation_rejects_nan_wrong_shape_and_low_accuracy() -> None:
    good = mlp().eval()
    x = torch.randn(20, 4)
    assert validate_candidate(lambda t: good(t).detach(), x).ok
    nan = validate_candidate(_Nan(), x)
    assert (
        not nan.ok
        and nan.reason == "20 of 20 recorded requests give non-finite outputs (NaN or inf)"
    )
    wide = torch.nn.Linear(4, 3)
    shaped = validate_candidate(lambda t: wide(t).detach(), x, serving=lambda t: good(t).detach())
    assert (
        not shaped.ok
        and "its output per row has shape (3,); the serving version's has (2,)" in shaped.reason
    )
    y = good(x).detach().argmax(dim=1)
    assert accuracy(good(x).detach(), y) == 1.0
    low = validate_candidate(lambda t: -good(t).detach(), None, labelled=(x, y), min_accuracy=0.9)
    assert not low.ok and low.reason.startswith(
        "accuracy 0.0000 on 20 labelled samples is below the threshold 0.9"
    )


def test_watch_pushes_files_once_their_size_holds(tmp_path: Path) -> None:
    seen: dict[str, tuple[float, int]] = {}
    (tmp_path / "v1.pt2").write_bytes(b"x" * 10)
    (tmp_path / "notes.txt").write_text("ignored")
    assert new_model_files(tmp_path, seen) == []  # first sight: wait for the size to hold
    assert new_model_files(tmp_path, seen) == [tmp_path / "v1.pt2"]
    assert new_model_files(tmp_path, seen) == []
    (tmp_path / "v2.pt2").write_bytes(b"y" * 5)
    new_model_files(tmp_path, seen)
    assert new_model_files(tmp_path, seen) == [tmp_path / "v2.pt2"]


def test_example_pipeline_tests_pass() -> None:
    from eventbus.pipelines._testing import run_test_file

    results = run_test_file(ROOT / "examples/fraud_model/fraud_test.yaml")
    assert results and all(r.passed for r in results), [d for r in results for d in r.diffs]


def test_model_split_usage_error_exits_2() -> None:
    from typer.testing import CliRunner

    from eventbus.cli import app

    result = CliRunner().invoke(app, ["model", "split", "fraud"])
    assert result.exit_code == 2
    assert "give a VERSION (and --weight), or --off to end the split" in result.output
