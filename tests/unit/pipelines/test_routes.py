"""``sinks:`` and ``routes:`` in pipeline YAML: what loads, how the routes compile, and every
problem reported at once at its position, naming the route, the value and the fix."""

from __future__ import annotations

import textwrap

import pytest

from eventbus import CloudEvent, cel
from eventbus.pipelines import load_pipeline_text, validate_pipeline_text
from eventbus.pipelines._routes import build_routing, route_predicate

HEAD = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: orders}
spec:
  sources: [{kafka: {topic: orders}}]
"""

GOOD = HEAD + textwrap.indent(
    textwrap.dedent(
        """\
        sinks:
          hook: {http: {url: "http://127.0.0.1:9/hook", reply: true}}
          enriched: {kafka: {topic: enriched}}
          audit: {kafka: {topic: audit, bootstrap_servers: "127.0.0.1:9999"}}
          billing: {pipeline: billing}
        routes:
          - when: "type == 'order.created'"
            sinks: [hook, enriched, audit]
            ordered: true
          - when: "data.amount > 1000"
            sinks: [billing]
          - default: true
            sinks: [audit]
        """
    ),
    "  ",
)


def problems(text: str) -> list[str]:
    config, found = validate_pipeline_text(text, "p.yaml")
    assert config is None
    return [str(p) for p in found]


def spec(body: str) -> str:
    return HEAD + textwrap.indent(textwrap.dedent(body), "  ")


def test_routes_load_and_compile() -> None:
    config = load_pipeline_text(GOOD, "p.yaml")
    assert sorted(config.spec.outputs()) == ["audit", "billing", "enriched", "hook"]
    assert config.spec.sinks is not None
    assert config.spec.sinks["billing"].options.topic == "eventbus-ingress-billing"
    routing = build_routing(config, lambda sink: sink.kind)
    assert routing is not None
    assert routing.sinks == {
        "hook": "http",
        "enriched": "kafka",
        "audit": "kafka",
        "billing": "pipeline",
    }
    first, second, default = routing.routes
    assert first.replies == {"hook": "enriched"} and first.targets == ("hook", "audit")
    assert first.ordered and routing.ordered == frozenset({"hook", "enriched", "audit"})
    assert default.when is None
    created = CloudEvent.create(type="order.created", source="/s", id="1", data={"amount": 5})
    big = CloudEvent.create(type="order.paid", source="/s", id="2", data={"amount": 5000})
    other = CloudEvent.create(type="order.paid", source="/s", id="3", data={"amount": 5})
    plan = routing.plan([created, big, other])
    assert {k: [i for i, _ in v] for k, v in plan.by_sink.items()} == {
        "hook": [0],
        "audit": [0, 2],
        "billing": [1],
    }
    assert plan.by_sink["hook"] == [(0, "enriched")]


def test_a_single_sink_pipeline_has_no_routing() -> None:
    text = spec("sink: {kafka: {topic: out}}\n")
    config = load_pipeline_text(text, "p.yaml")
    assert build_routing(config, lambda s: s) is None
    assert list(config.spec.outputs()) == ["sink"]


def test_every_route_problem_at_once_with_positions() -> None:
    text = spec(
        """\
        sinks:
          hook: {http: {url: "http://127.0.0.1:9/h"}}
          audit: {kafka: {topic: audit}}
          unused: {kafka: {topic: x}}
        routes:
          - default: true
            sinks: [audit]
          - when: "type == 'a' &&"
            sinks: [hok, audit, audit]
          - when: "data.x > 1"
            sinks: [hook]
        """
    )
    assert problems(text) == [
        "p.yaml:9:13: spec.sinks.unused: no route sends to sink 'unused'; add it to a route's sinks or remove it",
        "p.yaml:11:16: spec.routes[0].default: the default route must be the last route (it takes what "
        "routes before and after it did not); move it after routes[2]",
        "p.yaml:13:13: spec.routes[1].when: syntax error: unexpected end of input (column 15 of the "
        "expression); got \"type == 'a' &&\"",
        "p.yaml:14:15: spec.routes[1].sinks[0]: unknown sink 'hok' (did you mean 'hook'?); the sinks are "
        "audit, hook, unused: name one of them or add it under spec.sinks",
        "p.yaml:14:27: spec.routes[1].sinks[2]: sink 'audit' is named twice in this route; name it once",
    ]


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (
            "sink: {kafka: {topic: a}}\nsinks: {b: {kafka: {topic: b}}}\nroutes: [{default: true, sinks: [b]}]\n",
            "spec.sink: give either sink (one sink for every event) or sinks with routes; got both",
        ),
        ("sinks: {b: {kafka: {topic: b}}}\n", "spec.routes: sinks (b) are given but no routes"),
        ("steps: []\n", "spec.sink: required field is missing (or give sinks with routes)"),
        (
            "sinks: {b: {kafka: {topic: b}}}\nroutes: [{default: true, sinks: [b]}, {default: true, sinks: [b]}]\n",
            "spec.routes[1].default: routes[0] is the default route already",
        ),
        (
            "sinks: {b: {kafka: {topic: b}}}\nroutes: [{sinks: [b]}]\n",
            "spec.routes[0]: a route needs when (a CEL expression) or default: true",
        ),
        (
            "sinks: {b: {kafka: {topic: b}}}\nroutes: [{when: 'true', default: true, sinks: [b]}]\n",
            "a route takes when or default: true, not both",
        ),
        (
            "sinks: {h: {http: {url: 'http://127.0.0.1:1/', reply: true}}}\nroutes: [{default: true, sinks: [h]}]\n",
            "spec.routes[0].sinks[0]: sink 'h' has reply: true but is the last sink of the route",
        ),
        (
            "sink: {http: {url: 'http://127.0.0.1:1/', reply: true}}\n",
            "spec.sink.http.reply: reply: true sends the subscriber's replies to the next sink",
        ),
        (
            "sink: {pipeline: orders}\n",
            "spec.sink.pipeline: pipeline 'orders' would send its outputs into its own ingress topic",
        ),
        (
            "sinks: {b: {pipeline: Bad_Name}}\nroutes: [{default: true, sinks: [b]}]\n",
            "spec.sinks.b.pipeline: must match ^[a-z][a-z0-9-]{0,47}$; got 'Bad_Name'",
        ),
        (
            "sinks: {b: {kafka: {topic: b}}}\nroutes: [{when: 'no_such_var > 1', sinks: [b]}]\n",
            "spec.routes[0].when: unknown variable 'no_such_var'",
        ),
    ],
)
def test_route_problems_name_the_value_and_the_fix(body: str, expect: str) -> None:
    found = problems(spec(body))
    assert any(expect in p for p in found), found


def test_a_when_that_gives_no_bool_is_a_cel_error_at_run_time() -> None:
    when = route_predicate("data.amount")
    event = CloudEvent.create(type="t", source="/s", id="1", data={"amount": 3})
    with pytest.raises(cel.CELError, match="a route's when must give a bool"):
        when(event)
    assert route_predicate("data.amount > 2")(event) is True


def test_a_huge_route_list_is_refused_fast() -> None:
    routes = "".join(f"  - {{when: 'data.n == {i}', sinks: [b]}}\n" for i in range(65))
    found = problems(spec("sinks: {b: {kafka: {topic: b}}}\nroutes:\n" + routes))
    assert any("spec.routes: list should have at most 64 items" in p for p in found), found


def test_eventbus_test_checks_what_each_sink_gets(tmp_path) -> None:
    from pathlib import Path

    from eventbus.pipelines._testing import run_test_file

    example = Path(__file__).resolve().parents[3] / "examples" / "routes"
    assert all(r.passed for r in run_test_file(example / "orders_test.yaml"))
    (tmp_path / "orders.yaml").write_text((example / "orders.yaml").read_text())
    (tmp_path / "orders_test.yaml").write_text(
        textwrap.dedent(
            """\
            tests:
              - name: wrong
                input: [{type: order.cancelled, id: c1, data: {qty: 1, price: 5}}]
                routes: {hook: [{id: c1}], nope: []}
            """
        )
    )
    [result] = run_test_file(tmp_path / "orders_test.yaml")
    assert not result.passed
    assert "+++ routes.hook (actual)" in result.diffs[0] and "-- id: c1" in result.diffs[0]
    assert result.diffs[1] == "routes.nope: no such sink (sinks: hook, scored, archive, billing)"
