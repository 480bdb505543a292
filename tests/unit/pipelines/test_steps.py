"""Filter, convert and function steps, and the runner, in process."""

from __future__ import annotations

import textwrap

import pytest

from eventbus import CloudEvent, Failure
from eventbus.pipelines import PipelineRunner, load_pipeline_text


def pipeline(steps: str) -> PipelineRunner:
    text = textwrap.dedent(
        """\
        apiVersion: eventbus/v1
        kind: Pipeline
        metadata: {name: t}
        spec:
          sources: [{kafka: {topic: in}}]
          sink: {kafka: {topic: out}}
          steps:
        """
    ) + textwrap.indent(textwrap.dedent(steps), "    ")
    return PipelineRunner(load_pipeline_text(text, "t.yaml"))


def ev(i: int = 0, type_: str = "payment.created", **data: object) -> CloudEvent:
    return CloudEvent.create(type=type_, source="/t", id=f"e{i}", data=dict(data))


def test_filter_keeps_and_drops() -> None:
    r = pipeline("- id: f\n  filter: \"type == 'payment.created' && data.amount > 100\"\n")
    out = r.run([ev(0, amount=50), ev(1, amount=150), ev(2, "x", amount=500)])
    assert out[0] == [] and out[2] == []
    assert [e.id for e in out[1]] == ["e1"]


def test_filter_error_fails_closed_and_counts() -> None:
    r = pipeline('- id: f\n  filter: "data.amount > 100"\n')
    out = r.run([ev(0, other=1), ev(1, amount=200), ev(2, amount="x")])
    assert out[0] == [] and out[2] == [] and len(out[1]) == 1
    assert r.stats()["f"]["errors"] == 2


def test_filter_non_bool_is_an_error() -> None:
    r = pipeline('- id: f\n  filter: "data.amount"\n')
    assert r.run([ev(0, amount=1)]) == [[]]
    assert r.stats()["f"]["errors"] == 1


def test_subscription_dialects() -> None:
    r = pipeline(
        """\
        - id: f
          filter:
            all:
              - exact: {type: payment.created}
              - prefix: {source: /shop}
              - not: {suffix: {subject: test}}
              - any: [{cel: "data.amount > 100"}, "data.vip == true"]
        """
    )

    def mk(i: int, source: str, subject: str, **data: object) -> CloudEvent:
        return CloudEvent.create(
            type="payment.created", source=source, id=str(i), subject=subject, data=dict(data)
        )

    out = r.run(
        [
            mk(0, "/shop/1", "a", amount=200),
            mk(1, "/other", "a", amount=200),
            mk(2, "/shop/1", "x-test", amount=200),
            mk(3, "/shop/1", "a", amount=1, vip=True),
            mk(4, "/shop/1", "a", amount=1, vip=False),
        ]
    )
    assert [len(o) for o in out] == [1, 0, 0, 1, 0]  # type: ignore[arg-type]


def test_convert_sets_paths_and_attributes_from_the_input_event() -> None:
    r = pipeline(
        """\
        - id: c
          convert:
            set:
              data.amount_cny: "double(data.amount) * 7.1"
              data.meta.by: "source"
              type: "type + '.converted'"
              subject: "string(data.amount)"
            remove: [data.secret]
        """
    )
    src = ev(0, amount=10, secret="s", meta={"keep": 1})
    [[out]] = r.run([src])  # type: ignore[misc]
    assert out.type == "payment.created.converted"
    assert out.subject == "10"
    assert out.data == {"amount": 10, "amount_cny": 71.0, "meta": {"keep": 1, "by": "/t"}}
    assert src.data == {"amount": 10, "secret": "s", "meta": {"keep": 1}}  # input untouched


def test_convert_data_expression_and_time() -> None:
    r = pipeline(
        """\
        - id: c
          convert:
            data: "{'year': time.getFullYear(), 'items': data.items.map(x, x * 2)}"
        """
    )
    e = CloudEvent.create(
        type="t", source="/s", id="1", time="2024-05-01T10:00:00Z", data={"items": [1, 2]}
    )
    [[out]] = r.run([e])  # type: ignore[misc]
    assert out.data == {"year": 2024, "items": [2, 4]}


def test_convert_error_fails_only_that_event() -> None:
    r = pipeline('- id: c\n  convert: {set: {data.x: "data.a / data.b"}}\n')
    out = r.run([ev(0, a=1, b=0), ev(1, a=4, b=2)])
    assert isinstance(out[0], Failure) and out[0].step == "c"
    assert "division by zero" in out[0].message
    assert out[1][0].data["x"] == 2  # type: ignore[index]


def test_convert_attribute_must_be_string() -> None:
    r = pipeline('- id: c\n  convert: {set: {type: "1 + 1"}}\n')
    [f] = r.run([ev(0)])
    assert isinstance(f, Failure)
    assert f.message == "attribute 'type' must be a non-empty string; the expression gave 2"


def test_convert_values_that_are_not_scalars_or_strings_take_the_checked_path() -> None:
    # The per-event fast path passes scalars and non-empty strings through as they are; every
    # other value still gets json_value (data) or attribute_value (attributes).
    r = pipeline(
        """\
        - id: c
          convert:
            set:
              data.when: "timestamp('2024-05-01T10:00:00Z')"
              data.took: "duration('90s')"
              data.raw: "b'ab'"
              data.pair: "[1, 'x']"
              data.top: "'scalar'"
              count: "data.n + 1"
              flag: "true"
        """
    )
    [[out]] = r.run([ev(0, n=1)])  # type: ignore[misc]
    assert out.data == {
        "n": 1,
        "when": "2024-05-01T10:00:00Z",
        "took": "90s",
        "raw": "YWI=",
        "pair": [1, "x"],
        "top": "scalar",
    }
    assert out.attributes["count"] == 2 and out.attributes["flag"] is True
    [f] = r.run([CloudEvent.create(type="t", source="/s", id="2", data=7)])
    assert isinstance(f, Failure) and "data is int, not an object" in f.message
    empty = pipeline("- id: c\n  convert: {set: {subject: \"''\"}}\n")
    [g] = empty.run([ev(2)])
    assert isinstance(g, Failure)
    assert g.message == "attribute 'subject' must be a non-empty string; the expression gave ''"


def test_function_steps_per_event_and_batch_fanout() -> None:
    r = pipeline(
        """\
        - id: split
          function: tests.unit.pipelines.funcs:split_items
        - id: tag
          function: tests.unit.pipelines.funcs:tag_batch
        """
    )
    out = r.run([ev(0, items=[1, 2, 3]), ev(1, items=[]), ev(2, items=[7])])
    assert [[e.data for e in o] for o in out] == [  # type: ignore[union-attr]
        [{"item": 1, "tag": True}, {"item": 2, "tag": True}, {"item": 3, "tag": True}],
        [],
        [{"item": 7, "tag": True}],
    ]


def test_failing_function_fails_only_its_event_in_a_batch_function() -> None:
    r = pipeline("- id: f\n  function: tests.unit.pipelines.funcs:fail_on_negative\n")
    out = r.run([ev(0, n=1), ev(1, n=-1), ev(2, n=3)])
    assert isinstance(out[1], Failure)
    assert out[1].error_type == "ValueError" and out[1].message == "negative: -1"
    assert out[0][0].data == {"n": 2} and out[2][0].data == {"n": 6}  # type: ignore[index]


def test_bad_return_type_is_a_clear_failure() -> None:
    r = pipeline("- id: f\n  function: tests.unit.pipelines.funcs:returns_dict\n")
    [f] = r.run([ev(0)])
    assert isinstance(f, Failure)
    assert (
        "returned dict; return a CloudEvent, None (drop the event) or a list of CloudEvents"
        in f.message
    )


def test_a_function_step_tries_once_retries_are_the_sources() -> None:
    from tests.unit.pipelines import funcs

    funcs.FLAKY_CALLS.clear()
    r = pipeline("- id: f\n  function: tests.unit.pipelines.funcs:flaky\n  retries: 2\n")
    [res] = r.run([ev(0)])
    assert isinstance(res, Failure) and res.attempts == 1
    assert funcs.FLAKY_CALLS == ["e0"]


def test_trace_records_step_outputs() -> None:
    r = pipeline(
        '- id: f\n  filter: "data.n > 1"\n- id: c\n  convert: {set: {data.m: "data.n + 1"}}\n'
    )
    trace: dict[str, list[CloudEvent]] = {}
    r.run([ev(0, n=1), ev(1, n=2)], trace=trace)
    assert [e.id for e in trace["f"]] == ["e1"]
    assert trace["c"][0].data == {"n": 2, "m": 3}


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_batch_sizes(n: int) -> None:
    r = pipeline('- id: f\n  filter: "data.n % 2 == 0"\n')
    out = r.run([ev(i, n=i) for i in range(n)])
    assert sum(len(o) for o in out) == (n + 1) // 2  # type: ignore[arg-type]


def test_only_filter_and_convert_pipelines_are_pure() -> None:
    # pure pipelines may run small batches on the replica's event loop; anything that may
    # block (user functions, models, joins, the solver) runs on a worker thread
    assert pipeline(
        '- {id: f, filter: "data.n > 1"}\n- {id: c, convert: {set: {data.m: "data.n + 1"}}}'
    ).pure
    assert not pipeline("- id: f\n  function: tests.unit.pipelines.funcs:tag_batch\n").pure
