"""The ``pattern`` filter dialect (EventBridge event patterns): the CloudEvent as a pattern
sees it, the step and the loader, and hostile patterns and events."""

from __future__ import annotations

import re
import textwrap
import threading
from typing import Any

import pytest
from pydantic import ValidationError

from eventbus import CloudEvent
from eventbus.pipelines import PipelineRunner, load_pipeline_text, validate_pipeline_text
from eventbus.pipelines.steps._filter import FilterDialect
from eventbus.pipelines.steps._pattern import (
    MAX_PATTERN_DEPTH,
    PatternError,
    compile_event_pattern,
    compile_pattern,
    parse_pattern,
    pattern_problems,
)

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


def problems(steps: str) -> list[str]:
    config, found = validate_pipeline_text(
        HEAD + textwrap.indent(textwrap.dedent(steps), "    "), "p.yaml"
    )
    assert config is None
    return [str(p) for p in found]


def ev(i: int = 0, type_: str = "payment.created", data: Any = None, **attrs: Any) -> CloudEvent:
    return CloudEvent.create(type=type_, source="/shop/eu", id=f"e{i}", data=data, **attrs)


# -- the event as a pattern sees it ---------------------------------------------------------


def test_attributes_at_the_top_and_data_below() -> None:
    match = compile_event_pattern(
        {
            "type": [{"prefix": "payment."}],
            "source": ["/shop/eu"],
            "data": {"amount": [{"numeric": [">", 100]}]},
        }
    )
    assert match(ev(data={"amount": 150}))
    assert not match(ev(data={"amount": 50}))
    assert not match(ev(type_="order.created", data={"amount": 150}))


def test_eventbridge_names_are_aliases() -> None:
    match = compile_event_pattern(
        {"detail-type": ["payment.created"], "detail": {"currency": ["EUR"]}}
    )
    assert match(ev(data={"currency": "EUR"}))
    assert not match(ev(data={"currency": "USD"}))


def test_extensions_and_missing_attributes() -> None:
    match = compile_event_pattern({"partitionkey": ["eu"], "subject": [{"exists": False}]})
    assert match(ev(data={}, partitionkey="eu"))
    assert not match(ev(data={}, partitionkey="eu", subject="s"))
    assert not match(ev(data={}))


def test_non_json_data_is_a_leaf() -> None:
    match = compile_event_pattern({"data": {"x": [{"exists": False}]}})
    binary = CloudEvent.create(
        type="t", source="/s", id="1", data=b"\x00\x01", datacontenttype="application/octet-stream"
    )
    assert match(binary)
    assert not compile_event_pattern({"data": {"x": [1]}})(binary)


def test_top_level_or_sees_the_event() -> None:
    pattern = {"$or": [{"type": ["a"]}, {"detail": {"k": [1]}}], "source": [{"prefix": "/shop"}]}
    for match in (compile_event_pattern(pattern), parse_pattern(pattern).match_event):
        assert match(ev(type_="a", data={})) and match(ev(type_="b", data={"k": 1}))
        assert not match(ev(type_="b", data={"k": 2}))


@pytest.mark.parametrize(
    ("conditions", "value", "match"),
    [
        ([300], 300.0, True),  # numbers compare as numbers
        ([300], "300", False),  # never across types
        (["300"], 300, False),
        ([1], True, False),  # a bool is no number
        ([True], 1, False),
        ([None], None, True),
        ([None], "MISSING", False),
        (["a"], ["x", "a"], True),  # an event array matches when an element does
        (["a"], [["x"], ["a"]], True),
        (["a"], [], False),
        ([{"exists": False}], [], True),
        ([{"exists": True}], {"nested": 1}, False),  # objects are no leaves
        ([{"anything-but": "a"}], ["a", "b"], True),
        ([{"anything-but": "a"}], 5, True),  # anything-but matches other types
        ([{"anything-but": ["a"]}], "MISSING", False),
        ([{"numeric": [">=", 0, "<", 1]}], "0.5", False),  # numeric sees numbers only
        ([{"prefix": "1"}], 123, False),  # string operators see strings only
        ([{"cidr": "2001:db8::/32"}], "2001:db8::1", True),
        ([{"cidr": "10.0.0.0/8"}], "not-an-ip", False),
        ([{"wildcard": "a\\*b*"}], "a*bcd", True),
        ([{"wildcard": "a\\*b*"}], "axbcd", False),
        ([{"wildcard": "a\\\\b"}], "a\\b", True),
        ([{"exactly": "x"}], "x", True),
        (["a", {"exists": False}], "MISSING", True),
    ],
)
def test_leaf_semantics(conditions: list[Any], value: Any, match: bool) -> None:
    doc = {} if value == "MISSING" else {"f": value}
    assert compile_pattern({"f": conditions})(doc) is match


# -- the filter step and the loader ---------------------------------------------------------


def test_filter_step_with_a_pattern_and_inside_any_not() -> None:
    r = pipeline(
        """\
        - id: f
          filter:
            pattern:
              type: [{prefix: payment.}]
              data:
                amount: [{numeric: [">", 100]}]
        - id: g
          filter:
            any:
              - pattern: {data: {currency: [EUR]}}
              - not: {pattern: {source: [{prefix: /shop}]}}
        """
    )
    out = r.run(
        [
            ev(0, data={"amount": 150, "currency": "EUR"}),
            ev(1, data={"amount": 150, "currency": "USD"}),
            ev(2, data={"amount": 5}),
        ]
    )
    assert [[e.id for e in o] for o in out] == [["e0"], [], []]
    assert r.stats()["f"]["errors"] == 0 and r.stats()["g"]["errors"] == 0


def test_a_bad_pattern_is_reported_at_its_line_and_column() -> None:
    found = problems(
        """\
        - id: f
          filter:
            pattern:
              data:
                price: [{numerc: [">", 1]}]
        - id: g
          filter:
            all:
              - pattern: {type: [{wildcard: "a**b"}]}
        """
    )
    assert found == [
        "p.yaml:12:30: spec.steps[0].filter.pattern.data.price[0].numerc: unknown operator "
        "'numerc' (did you mean 'numeric'? operators: anything-but, cidr, equals-ignore-case, "
        "exactly, exists, numeric, prefix, suffix, wildcard)",
        "p.yaml:16:41: spec.steps[1].filter.all[0].pattern.type[0].wildcard: wildcard 'a**b': "
        "consecutive wildcard characters at position 1; one * already matches any run of characters",
    ]


def test_every_bad_field_is_reported_not_only_the_first() -> None:
    pattern = {
        "type": ["ok"],
        "data": {"a": [{"numerc": 1}], "b": "x", "c": {"d": [{"wildcard": "**"}]}},
        "$or": [{"e": []}, {"f": [1]}],
    }
    assert [p.loc for p in pattern_problems(pattern)] == [
        ("data", "a", 0, "numerc"),
        ("data", "b"),
        ("data", "c", "d", 0, "wildcard"),
        ("$or", 0, "e"),
    ]
    with pytest.raises(ValidationError) as info:
        FilterDialect.model_validate({"pattern": pattern})
    assert len(info.value.errors()) == 4
    assert pattern_problems({"type": ["ok"]}) == []


def test_the_python_api_raises_a_validation_error_at_the_path() -> None:
    with pytest.raises(ValidationError) as info:
        FilterDialect.model_validate({"pattern": {"data": {"n": [{"numeric": ["<", 5, ">", 1]}]}}})
    (err,) = info.value.errors()
    assert err["loc"] == ("pattern", "data", "n", 0, "numeric")
    assert "lower bound (> or >=) first" in err["msg"]


@pytest.mark.parametrize(
    ("pattern", "loc", "message"),
    [
        ({}, (), "an empty object matches nothing"),
        ([], (), "a pattern is an object of fields"),
        ({"a": "x"}, ("a",), "write ['x']"),
        ({"a": 1}, ("a",), "write [1]"),
        (
            {"a": {"prefix": "x"}},
            ("a", "prefix"),
            "conditions go in a list under the field, e.g. a: [{'prefix': 'x'}]",
        ),
        ({"a": []}, ("a",), "an empty list matches nothing"),
        ({"a": {}}, ("a",), "an empty object"),
        ({"a": [[1]]}, ("a", 0), "a condition must be a string, number"),
        ({"a": [{"prefix": "x", "suffix": "y"}]}, ("a", 0), "exactly one operator"),
        ({"a": [{}]}, ("a", 0), "exactly one operator"),
        ({"a": [{"exists": "yes"}]}, ("a", 0, "exists"), "true or false"),
        ({"a": [{"prefix": 3}]}, ("a", 0, "prefix"), "prefix takes a string"),
        ({"a": [{"prefix": {"ignore": "x"}}]}, ("a", 0, "prefix"), "{equals-ignore-case: string}"),
        ({"a": [{"numeric": [">", "1"]}]}, ("a", 0, "numeric", 1), "must be a finite number"),
        ({"a": [{"numeric": ["~", 1]}]}, ("a", 0, "numeric", 0), "unknown comparison '~'"),
        ({"a": [{"numeric": [">", 5, "<", 1]}]}, ("a", 0, "numeric"), "lower bound must be below"),
        ({"a": [{"numeric": 5}]}, ("a", 0, "numeric"), "numeric takes [op, number]"),
        ({"a": [{"anything-but": None}]}, ("a", 0, "anything-but"), "strings or numbers"),
        ({"a": [{"anything-but": []}]}, ("a", 0, "anything-but"), "non-empty list"),
        (
            {"a": [{"anything-but": ["x", 1]}]},
            ("a", 0, "anything-but"),
            "mixes strings and numbers",
        ),
        (
            {"a": [{"anything-but": {"numeric": [">", 1]}}]},
            ("a", 0, "anything-but"),
            "prefix|suffix",
        ),
        (
            {"a": [{"anything-but": {"prefix": ""}}]},
            ("a", 0, "anything-but", "prefix"),
            "empty prefix",
        ),
        ({"a": [{"wildcard": "a\\b"}]}, ("a", 0, "wildcard"), "invalid escape at position 1"),
        ({"a": [{"wildcard": "ab\\"}]}, ("a", 0, "wildcard"), "invalid escape at position 2"),
        ({"a": [{"wildcard": "**"}]}, ("a", 0, "wildcard"), "consecutive wildcard"),
        ({"a": [{"cidr": "10.0.0.1"}]}, ("a", 0, "cidr"), "needs a prefix length"),
        ({"a": [{"cidr": "10.0.0.300/8"}]}, ("a", 0, "cidr"), "is not an IPv4 or IPv6 network"),
        ({"$or": {"a": [1]}}, ("$or",), "list of two or more patterns"),
        ({"$or": [{"a": [1]}]}, ("$or",), "list of two or more patterns"),
        ({"$or": [{"a": [1]}, "b"]}, ("$or", 1), "a pattern is an object of fields"),
        ({"a": [{"equals-ignore-case": ["x"]}]}, ("a", 0, "equals-ignore-case"), "takes a string"),
    ],
)
def test_malformed_patterns(pattern: Any, loc: tuple[Any, ...], message: str) -> None:
    with pytest.raises(PatternError, match=re.escape(message)) as info:
        compile_pattern(pattern)
    assert info.value.loc == loc


# -- hostile --------------------------------------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    pattern: dict[str, Any] = {"x": [1]}
    for _ in range(depth):
        pattern = {"a": pattern}
    return pattern


def test_a_thousand_levels_is_a_clear_error_not_a_recursion_error() -> None:
    with pytest.raises(PatternError, match=f"deeper than {MAX_PATTERN_DEPTH} levels") as info:
        compile_pattern(_nested(1000))
    assert len(info.value.loc) == MAX_PATTERN_DEPTH + 1
    deep_or: dict[str, Any] = {"x": [1]}
    for _ in range(1000):
        deep_or = {"$or": [deep_or, {"y": [2]}]}
    with pytest.raises(PatternError, match="deeper than"):
        compile_event_pattern(deep_or)
    # in pipeline YAML: past the pattern's limit, then past the YAML loader's
    text = "- id: f\n  filter:\n    pattern: {}\n"
    found = problems(text.format("{a: " * 80 + "{x: [1]}" + "}" * 80))
    assert len(found) == 1 and "the pattern nests deeper than 64 levels" in found[0]
    assert found[0].startswith("p.yaml:10:")
    found = problems(text.format("{a: " * 1000 + "{x: [1]}" + "}" * 1000))
    assert found == ["p.yaml:10:395: yaml: the document nests deeper than 100 levels; flatten it"]


def test_the_deepest_allowed_pattern_matches() -> None:
    pattern = _nested(MAX_PATTERN_DEPTH - 1)
    event: Any = {"x": 1}
    for _ in range(MAX_PATTERN_DEPTH - 1):
        event = {"a": event}
    assert compile_pattern(pattern)(event)


def test_deep_and_wide_events_do_not_exhaust_the_stack() -> None:
    deep: Any = "a"
    for _ in range(100_000):
        deep = [deep]
    assert compile_pattern({"f": ["a"]})({"f": deep})
    assert compile_pattern({"f": {"g": [1]}})({"f": deep}) is False
    assert compile_pattern({"f": ["z"]})({"f": list(map(str, range(200_000)))}) is False


def test_ten_thousand_alternatives_are_a_set_lookup() -> None:
    values = [f"v{i}" for i in range(10_000)]
    match = compile_pattern({"f": values, "n": list(range(10_000))})
    hits = sum(match({"f": f"v{i}", "n": i}) for i in range(0, 20_000, 7))
    assert hits == len(range(0, 10_000, 7))
    assert not match({"f": "v1", "n": 10_000})
    # anything-but lists are sets too
    assert not compile_pattern({"f": [{"anything-but": values}]})({"f": "v9999"})


def test_wildcards_do_not_backtrack() -> None:
    # A backtracking matcher takes exponential time here; one find per literal is linear.
    star = "*".join(["a"] * 30) + "*b"
    match = compile_pattern({"f": [{"wildcard": star}]})
    assert not match({"f": "a" * 100_000})
    assert match({"f": "a" * 100_000 + "b"})
    ends = compile_pattern({"f": [{"wildcard": "*a*a*a*a*a*a*a*a*a*a*c"}]})
    assert not ends({"f": "a" * 50_000})


def test_thousands_of_fields_compile_to_one_function() -> None:
    pattern = {f"f{i}": [i, {"prefix": f"p{i}"}] for i in range(5_000)}
    match = compile_pattern(pattern)
    event = {f"f{i}": i if i % 2 else f"p{i}x" for i in range(5_000)}
    assert match(event)
    assert not match({**event, "f4999": 1})


def test_concurrent_matching_from_threads() -> None:
    match = compile_event_pattern(
        {
            "type": [{"prefix": "payment."}],
            "data": {"amount": [{"numeric": [">", 100]}], "tags": [{"wildcard": "e*"}]},
        }
    )
    events = [ev(i, data={"amount": i, "tags": ["x", "eu" if i % 2 else "us"]}) for i in range(400)]
    expected = [match(e) for e in events]
    results: list[list[bool]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                results.append([match(e) for e in events])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 160 and all(r == expected for r in results)
    assert sum(expected) == len([i for i in range(101, 400) if i % 2])


def test_the_docs_example_runs() -> None:
    from tests.docs.blocks import blocks

    (block,) = [b for b in blocks("yaml") if "large_card_payments" in b.text]
    r = pipeline(block.text)

    def pay(i: int, source: str = "/shop", **data: Any) -> CloudEvent:
        base = {"amount": 500, "card": {"brand": "VISA"}, "country": "DE"}
        return CloudEvent.create(
            type="payment.created", source=source, id=f"e{i}", data={**base, **data}
        )

    events = [
        pay(0),
        pay(1, source="/test/x"),
        pay(2, amount=100),
        pay(3, card=[{"brand": "amex"}, {"brand": "mastercard"}]),
        pay(4, country="US"),
        pay(5, country="US", ip="10.1.2.3"),
        pay(6, card={"brand": "amex"}),
    ]
    out = r.run(events)
    assert [o[0].id for o in out if o] == ["e0", "e3", "e5"]
