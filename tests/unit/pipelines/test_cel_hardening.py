"""CEL hardening seen from pipelines: hostile expressions are positional validation errors,
and a CEL evaluation that exceeds its budget fails only that event."""

from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path

from typer.testing import CliRunner

from eventbus.cli import app
from eventbus.pipelines import validate_pipeline_text

HOSTILE = {
    "digits": "data.n == 1\u0663",
    "long_int": "data.n == " + "1" * 5000,
    "brackets": "size(" + "[" * 99 + ") > 0",
    "bangs": "!" * 3000 + "true",
    "regex": "data.s.matches('(?=a)b')",
}


def _pipeline(filters: dict[str, str]) -> str:
    steps = "".join(
        f'    - id: {step_id}\n      filter: "{source}"\n' for step_id, source in filters.items()
    )
    head = textwrap.dedent(
        """\
        apiVersion: eventbus/v1
        kind: Pipeline
        metadata: {name: hostile}
        spec:
          sources:
            - kafka: {topic: in}
          steps:
        """
    )
    return head + steps + "  sink: {kafka: {topic: out}}\n"


def test_hostile_expressions_are_positional_validation_errors() -> None:
    text = _pipeline(HOSTILE)
    start = time.perf_counter()
    config, problems = validate_pipeline_text(text, "p.yaml")
    assert time.perf_counter() - start < 5.0
    assert config is None
    found = {p.path: str(p) for p in problems}
    assert len(found) == len(HOSTILE), found
    lines = text.splitlines()
    for i, (step_id, source) in enumerate(HOSTILE.items()):
        message = found[f"spec.steps[{i}].filter"]
        m = re.match(
            rf"p\.yaml:(\d+):(\d+): spec\.steps\[{i}\]\.filter: step '{step_id}': "
            r".+ \(column (\d+) of the expression\)$",
            message,
        )
        assert m is not None, message
        line, col, col_in_expr = (int(g) for g in m.groups())
        assert lines[line - 1].lstrip().startswith("filter:")
        # the reported column points at the offending character of the expression
        value_start = lines[line - 1].index('"') + 2  # 1-based column of the first char
        assert col == value_start + col_in_expr - 1
        assert 1 <= col_in_expr <= len(source)
    assert "invalid number literal" in found["spec.steps[0].filter"]
    assert "int literal out of range" in found["spec.steps[1].filter"]
    assert "nesting exceeds the maximum depth" in found["spec.steps[2].filter"]
    assert "nesting exceeds the maximum depth" in found["spec.steps[3].filter"]
    assert "RE2 syntax" in found["spec.steps[4].filter"]


def test_eventbus_validate_reports_hostile_expressions_and_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(_pipeline(HOSTILE))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [ln for ln in result.output.splitlines() if ln.startswith(f"{path}:")]
    assert len(lines) == len(HOSTILE), result.output
    assert all(
        re.match(rf"{re.escape(str(path))}:\d+:\d+: spec\.steps\[\d\]\.filter: ", ln)
        for ln in lines
    )


def _budget_pipeline() -> str:
    return textwrap.dedent(
        """\
        apiVersion: eventbus/v1
        kind: Pipeline
        metadata: {name: budget}
        spec:
          sources:
            - kafka: {topic: in}
          steps:
            - id: keep
              filter: "size(data.items.map(i, data.s).join('')) < 1000000000"
            - id: blow_up
              convert:
                set:
                  data.joined: "data.items.map(i, data.s).join('')"
          sink: {kafka: {topic: out}}
        """
    )


def test_over_budget_fails_only_that_event_in_a_filter_and_a_convert() -> None:
    from eventbus.eventing import CloudEvent
    from eventbus.testing import run_pipeline

    def event(n: int, s: str) -> CloudEvent:
        return CloudEvent(
            {"specversion": "1.0", "id": f"e{n}", "source": "/t", "type": "t"},
            {"items": list(range(1000)), "s": s},
        )

    small, big = event(1, "ab"), event(2, "x" * 110_000)
    start = time.perf_counter()
    result = run_pipeline(_budget_pipeline(), [small, big, event(3, "cd")])
    assert time.perf_counter() - start < 5.0
    # The filter drops the over-budget event (fail closed); the others go on.
    assert [e.attributes["id"] for e in result.outputs] == ["e1", "e3"]
    assert result.outputs[0].data["joined"] == "ab" * 1000
    assert result.dropped == 1

    # Without the filter, the convert step fails that one event: a dead letter naming
    # the budget, while the events around it are converted.
    text = _budget_pipeline().replace(
        "    - id: keep\n      filter: \"size(data.items.map(i, data.s).join('')) < 1000000000\"\n",
        "",
    )
    result = run_pipeline(text, [small, big, event(3, "cd")])
    assert [e.attributes["id"] for e in result.outputs] == ["e1", "e3"]
    assert len(result.dead_letters) == 1
    dead = result.dead_letters[0]
    assert dead.attributes["id"] == "e2"
    assert dead.attributes["ebstep"] == "blow_up"
    assert "exceeded its budget of 10,000,000 characters" in dead.attributes["eberror"]
    assert "raise max_output_size" in dead.attributes["eberror"]
