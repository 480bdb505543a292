"""``filter: {sql: ...}`` and route ``when: {sql: ...}``: CloudEvents SQL in pipelines, its
evaluation errors counted per event, and its syntax errors reported by validate at their
position in the YAML file, naming the step."""

from __future__ import annotations

import textwrap

from eventbus import CloudEvent
from eventbus.pipelines import PipelineRunner, load_pipeline_text, validate_pipeline_text
from eventbus.pipelines._routes import build_routing

HEAD = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: t}
spec:
  sources: [{kafka: {topic: in}}]
"""


def runner(steps: str) -> PipelineRunner:
    text = HEAD + "  sink: {kafka: {topic: out}}\n  steps:\n" + textwrap.indent(steps, "    ")
    return PipelineRunner(load_pipeline_text(text, "t.yaml"))


def ev(i: int, type_: str, **attrs: object) -> CloudEvent:
    return CloudEvent.create(type=type_, source="https://shop/1", id=f"e{i}", **attrs)


def test_sql_filter_keeps_drops_and_counts_errors() -> None:
    r = runner("- id: f\n  filter: {sql: \"type LIKE 'order.%' AND tier = 'gold'\"}\n")
    out = r.run(
        [ev(0, "order.created", tier="gold"), ev(1, "order.created", tier="x"), ev(2, "order.paid")]
    )
    assert [e.id for e in out[0]] == ["e0"] and out[1] == [] and out[2] == []
    stats = r.stats()["f"]
    assert stats["errors"] == 1  # e2 has no tier: a missingAttribute error, not a crash


def test_sql_inside_all_any_not() -> None:
    r = runner(
        textwrap.dedent(
            """\
            - id: f
              filter:
                all:
                  - sql: "EXISTS tier AND tier IN ('gold', 'silver')"
                  - not: {sql: "type = 'order.cancelled'"}
                  - any: [{prefix: {source: "https://"}}, {sql: "FALSE"}]
            """
        )
    )
    out = r.run(
        [
            ev(0, "order.created", tier="gold"),
            ev(1, "order.cancelled", tier="gold"),
            ev(2, "order.created"),
        ]
    )
    assert [len(o) for o in out] == [1, 0, 0]
    assert r.stats()["f"]["errors"] == 0


def test_validate_reports_sql_errors_at_their_position_naming_the_step() -> None:
    text = HEAD + textwrap.indent(
        textwrap.dedent(
            """\
            sink: {kafka: {topic: out}}
            steps:
              - id: only_orders
                filter: {sql: "type LIKE 'order.%' AND = 3"}
              - id: nested
                filter: {any: [{sql: "NOPE(1)"}]}
            """
        ),
        "  ",
    )
    config, problems = validate_pipeline_text(text, "p.yaml")
    assert config is None
    lines = [str(p) for p in problems]
    assert lines[0].startswith(
        "p.yaml:9:46: spec.steps[0].filter.sql: step 'only_orders': expected a value"
    )
    assert "got '='" in lines[0] and "(column 25 of the expression)" in lines[0]
    assert lines[1].startswith(
        "p.yaml:11:29: spec.steps[1].filter.any[0].sql: step 'nested': unknown function 'NOPE'"
    )


def test_route_when_sql() -> None:
    text = HEAD + textwrap.indent(
        textwrap.dedent(
            """\
            sinks:
              gold: {kafka: {topic: gold}}
              rest: {kafka: {topic: rest}}
            routes:
              - when: {sql: "tier = 'gold'"}
                sinks: [gold]
              - default: true
                sinks: [rest]
            """
        ),
        "  ",
    )
    config = load_pipeline_text(text, "p.yaml")
    routing = build_routing(config, lambda sink: sink.kind)
    assert routing is not None
    when = routing.routes[0].when
    assert when is not None
    assert when(ev(0, "a", tier="gold")) is True and when(ev(1, "a", tier="x")) is False
    bad = text.replace("tier = 'gold'", "tier = ")
    _, problems = validate_pipeline_text(bad, "p.yaml")
    assert any(
        "routes[0].when: expected a value" in str(p) and "column 8" in str(p) for p in problems
    )
