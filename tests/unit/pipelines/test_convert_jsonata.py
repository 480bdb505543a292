"""``convert: {jsonata: ...}``: the whole event in, the whole new event out (Knative's
EventTransform form); errors fail only their event; bad expressions are positional problems."""

from __future__ import annotations

import textwrap

from eventbus import CloudEvent, Failure
from eventbus.pipelines import PipelineRunner, load_pipeline_text, validate_pipeline_text

HEAD = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: t}
spec:
  sources: [{kafka: {topic: in}}]
  sink: {kafka: {topic: out}}
  steps:
"""


def pipeline(steps: str) -> PipelineRunner:
    return PipelineRunner(
        load_pipeline_text(HEAD + textwrap.indent(textwrap.dedent(steps), "    "), "t.yaml")
    )


def ev(i: int, **data: object) -> CloudEvent:
    return CloudEvent.create(type="order.created", source="/shop", id=f"e{i}", data=dict(data))


TRANSFORM = """\
- id: reshape
  convert:
    jsonata: |
      {
        "specversion": "1.0",
        "id": id,
        "source": "transform.orders",
        "type": type & ".reshaped",
        "customer": data.customer,
        "data": {"total": $sum(data.lines.(price * qty)), "skus": [data.lines.sku]}
      }
"""


def test_jsonata_produces_the_new_event_with_attributes() -> None:
    r = pipeline(TRANSFORM)
    [[out]] = r.run([ev(1, customer="c42", lines=[{"sku": "a", "price": 2, "qty": 3}])])
    assert out.type == "order.created.reshaped"
    assert out.source == "transform.orders"
    assert out.id == "e1"
    assert out.attributes["customer"] == "c42"
    assert out.data == {"total": 6, "skus": ["a"]}
    assert out.attributes["datacontenttype"] == "application/json"


def test_evaluation_error_fails_only_that_event() -> None:
    r = pipeline(TRANSFORM)
    out = r.run([ev(1, customer="c", lines=[{"sku": "a", "price": "2", "qty": 1}]),
                 ev(2, customer="c", lines=[{"sku": "b", "price": 5, "qty": 1}])])  # fmt: skip
    assert isinstance(out[0], Failure) and out[0].step == "reshape"
    assert "JSONata T2001" in out[0].message
    assert out[1][0].data == {"total": 5, "skus": ["b"]}  # type: ignore[index]


def test_result_that_is_not_an_event_fails_with_the_fix() -> None:
    r = pipeline('- id: c\n  convert: {jsonata: "data.amount"}\n')
    [f] = r.run([ev(1, amount=3)])
    assert isinstance(f, Failure)
    assert "must produce the new event as an object" in f.message
    r = pipeline("- id: c\n  convert: {jsonata: '{\"data\": data}'}\n")
    [f] = r.run([ev(1, amount=3)])
    assert isinstance(f, Failure)
    assert "lacks the required attribute(s) ['id', 'source', 'type']" in f.message


def test_runaway_expression_fails_the_event_not_the_step() -> None:
    r = pipeline("- id: c\n  convert: {jsonata: '($f := function($n) { $n + $f($n) }; $f(1))'}\n")
    [f] = r.run([ev(1)])
    assert isinstance(f, Failure) and "U1001" in f.message


def test_bad_expression_is_a_positional_problem_naming_the_step() -> None:
    text = HEAD + "    - id: reshape\n      convert: {jsonata: \"{'a': data.x\"}\n"
    config, problems = validate_pipeline_text(text, "p.yaml")
    assert config is None
    [p] = [str(x) for x in problems]
    assert p.startswith("p.yaml:9:38:")  # line 9, the expression's end
    assert "spec.steps[0].convert.jsonata: step 'reshape': JSONata S0203" in p


def test_jsonata_excludes_the_cel_forms() -> None:
    text = HEAD + "    - id: c\n      convert: {jsonata: '$', data: 'data'}\n"
    config, problems = validate_pipeline_text(text, "p.yaml")
    assert config is None
    assert any("drop 'set', 'remove' and 'data'" in str(p) for p in problems)
