"""Pipeline unit tests (``eventbus test``), as ``benthos test`` has them.

A ``<name>_test.yaml`` beside ``<name>.yaml`` lists cases: input events, and the outputs
expected of the whole pipeline (``output``) and/or of single steps (``steps``), and the
events expected to fail (``failed``). They run in process, without the stack::

    pipeline: payments.yaml          # optional: defaults to the file name minus "_test"
    tests:
      - name: a large payment is converted
        input:
          - {type: payment.created, data: {amount: 150, currency: USD}}
        output:
          - {type: payment.large, data: {amount: 150, currency: USD, amount_cny: 1065.0}}
        steps:
          only_large:
            - {type: payment.created}
        failed:
          - {index: 0, step: score, error: "division by zero"}
        routes:                      # pipelines with routes: what each named sink gets
          hook: [{type: payment.large}]
          archive: []

An expected event matches when every attribute it names equals the actual one and, if it
names ``data``, the data are equal.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eventbus.errors import ConfigError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._loader import load_pipeline
from eventbus.pipelines._runner import PipelineRunner
from eventbus.pipelines._yaml import load_yaml

__all__ = ["CaseResult", "find_test_files", "run_test_file"]


@dataclass
class CaseResult:
    """The result of one test case."""

    file: str
    name: str
    passed: bool
    diffs: list[str] = field(default_factory=list)


def find_test_files(paths: list[str]) -> list[Path]:
    """Test files for the given paths: test files as they are, the ``_test.yaml`` beside a
    pipeline file, every ``*_test.yaml`` under a directory.

    Raises:
        ConfigError: a path does not exist or a pipeline has no test file.
    """
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out.extend(sorted(p.rglob("*_test.yaml")))
        elif p.name.endswith(("_test.yaml", "_test.yml")):
            out.append(p)
        elif p.exists():
            cand = p.with_name(p.stem + "_test" + p.suffix)
            if not cand.exists():
                msg = f"{p}: no test file {cand.name} beside it; write one (see `eventbus test --help`)"
                raise ConfigError(msg)
            out.append(cand)
        else:
            msg = f"{p}: no such file or directory"
            raise ConfigError(msg)
    return out


def _to_event(obj: Any, where: str, i: int) -> CloudEvent:
    if not isinstance(obj, dict):
        msg = f"{where}: input[{i}] must be a mapping of attributes and data; got {obj!r}"
        raise ConfigError(msg)
    attrs = {"specversion": "1.0", "id": f"test-{i}", "source": "eventbus-test"}
    attrs.update({k: v for k, v in obj.items() if k != "data"})
    if "type" not in attrs:
        msg = f"{where}: input[{i}] needs a 'type'"
        raise ConfigError(msg)
    data = obj.get("data")
    if data is not None and "datacontenttype" not in attrs:
        attrs["datacontenttype"] = "application/json"
    return CloudEvent(attrs, data)


def _matches(expected: dict[str, Any], actual: CloudEvent) -> bool:
    for k, v in expected.items():
        if k == "data":
            if actual.data != v:
                return False
        elif actual.attributes.get(k) != v:
            return False
    return True


def _render(events: list[dict[str, Any]]) -> list[str]:
    return yaml.safe_dump(events, sort_keys=True, default_flow_style=False).splitlines()


def _compare(label: str, expected: list[Any], actual: list[CloudEvent]) -> str | None:
    ok = len(expected) == len(actual) and all(
        isinstance(e, dict) and _matches(e, a) for e, a in zip(expected, actual)
    )
    if ok:
        return None
    shown = []
    for i, a in enumerate(actual):
        keys = (
            set(expected[i])
            if i < len(expected) and isinstance(expected[i], dict)
            else set(a.attributes) | {"data"}
        )
        shown.append({k: (a.data if k == "data" else a.attributes.get(k)) for k in sorted(keys)})
    diff = difflib.unified_diff(
        _render(expected), _render(shown), f"{label} (expected)", f"{label} (actual)", lineterm=""
    )
    return "\n".join(diff)


def run_test_file(path: Path) -> list[CaseResult]:
    """Run every case of one test file.

    Raises:
        PipelineConfigError: the pipeline under test is invalid.
        ConfigError: the test file is malformed.
    """
    where = str(path)
    try:
        _, doc = load_yaml(path.read_text(encoding="utf-8"), where)  # no anchors or aliases
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        msg = f"{at}: yaml: {exc.problem or exc}"
        raise ConfigError(msg) from exc
    except yaml.YAMLError as exc:
        msg = f"{where}: not valid YAML: {exc}"
        raise ConfigError(msg) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("tests"), list):
        msg = f"{where}: a test file is a mapping with a 'tests' list"
        raise ConfigError(msg)
    target = doc.get("pipeline") or path.name.replace("_test.yaml", ".yaml").replace(
        "_test.yml", ".yml"
    )
    pipeline_path = (path.parent / target).resolve()
    sys.path.insert(0, str(pipeline_path.parent))
    try:
        config = load_pipeline(pipeline_path)
        runner = PipelineRunner(config, base_dirs=[str(pipeline_path.parent)])
        results = [_run_case(runner, case, where, i) for i, case in enumerate(doc["tests"])]
    finally:
        sys.path.remove(str(pipeline_path.parent))
    return results


def _route_diffs(runner: PipelineRunner, expected: Any, outputs: list[CloudEvent]) -> list[str]:
    """Compare what the routes send each named sink (``routes: {sink: [events]}``) with the
    case's expectation; replies of ``reply: true`` sinks are not simulated."""
    if expected is None:
        return []
    from eventbus.pipelines._routes import build_routing

    routing = build_routing(runner.config, lambda sink: sink)
    if routing is None:
        return ["routes: the pipeline has no routes (it has one sink); use output instead"]
    if not isinstance(expected, dict):
        return ["routes: a mapping of sink name to the events it gets, e.g. {hook: [{type: t}]}"]
    plan = routing.plan(outputs)
    diffs = []
    for name, events in expected.items():
        if name not in routing.sinks:
            known = ", ".join(routing.sinks)
            diffs.append(f"routes.{name}: no such sink (sinks: {known})")
            continue
        got = [outputs[i] for i, _ in plan.by_sink.get(name, [])]
        d = _compare(f"routes.{name}", events or [], got)
        if d:
            diffs.append(d)
    for i, error in plan.errors.items():
        diffs.append(f"routes: output {i} ({outputs[i].attributes.get('id')}): {error}")
    return diffs


def _run_case(runner: PipelineRunner, case: Any, where: str, index: int) -> CaseResult:
    if not isinstance(case, dict) or not isinstance(case.get("input"), list):
        msg = f"{where}: tests[{index}] needs an 'input' list of events"
        raise ConfigError(msg)
    name = str(case.get("name", f"case {index}"))
    events = [_to_event(obj, f"{where}: tests[{index}]", i) for i, obj in enumerate(case["input"])]
    trace: dict[str, list[CloudEvent]] = {}
    outcomes = runner.run(events, trace=trace)
    outputs = [e for o in outcomes if isinstance(o, list) for e in o]
    outputs += runner.flush(trace=trace)  # end of the case: aggregate windows close
    diffs: list[str] = []
    if "output" in case:
        d = _compare("output", case["output"] or [], outputs)
        if d:
            diffs.append(d)
    diffs += _route_diffs(runner, case.get("routes"), outputs)
    for step_id, expected in (case.get("steps") or {}).items():
        if step_id not in trace:
            diffs.append(f"steps.{step_id}: no such step (steps: {', '.join(trace)})")
            continue
        d = _compare(f"steps.{step_id}", expected or [], trace[step_id])
        if d:
            diffs.append(d)
    failures = [(i, o) for i, o in enumerate(outcomes) if isinstance(o, Failure)]
    expected_failed = case.get("failed") or []
    got_failed: list[dict[str, Any]] = [
        {"index": i, "step": f.step, "error": f"{f.error_type}: {f.message}"} for i, f in failures
    ]
    ok = len(expected_failed) == len(got_failed) and all(
        e.get("index", g["index"]) == g["index"]
        and e.get("step", g["step"]) == g["step"]
        and str(e.get("error", "")) in g["error"]
        for e, g in zip(expected_failed, got_failed)
    )
    if not ok:
        diff = difflib.unified_diff(
            _render(expected_failed),
            _render(got_failed),
            "failed (expected)",
            "failed (actual)",
            lineterm="",
        )
        diffs.append("\n".join(diff))
    return CaseResult(file=where, name=name, passed=not diffs, diffs=diffs)
