"""JSONata against hostile input: huge and deep expressions, runaway recursion, huge output,
and one compiled expression evaluated from many threads at once."""

from __future__ import annotations

import re
import threading

import pytest

from eventbus import jsonata
from eventbus.jsonata import Budget, JSONataError


def test_api_example() -> None:
    expr = jsonata.compile('{"total": $sum(lines.(price * qty)), "ids": lines#$i[$i > 0].id}')
    data = {"lines": [{"id": "a", "price": 2, "qty": 3}, {"id": "b", "price": 1, "qty": 4}]}
    assert expr.evaluate(data) == {"total": 10, "ids": "b"}
    assert jsonata.compile("missing").evaluate(data) is jsonata.UNDEFINED


def test_syntax_error_is_positional() -> None:
    with pytest.raises(
        JSONataError, match=re.escape("JSONata S0202 at position 7: Expected ')', got ']'")
    ):
        jsonata.compile("(a + b]")


def test_one_megabyte_expression_compiles_or_is_refused_clearly() -> None:
    big = " + ".join(["1"] * 250_000)  # 1 MB of a flat sum: no nesting, 250,000 operands
    assert len(big) < 1_000_000
    with pytest.raises(JSONataError) as info:
        jsonata.compile(big)
    assert info.value.code == "U1002"  # a chain of binary operators nests left-deep
    assert "nested deeper than" in str(info.value)
    text = '"' + "x" * 999_000 + '"'  # 1 MB string literal: fine
    assert jsonata.compile(text).evaluate(None) == "x" * 999_000
    with pytest.raises(JSONataError, match="exceeds the limit of 1000000"):
        jsonata.compile("1" * 1_000_001)


@pytest.mark.parametrize("opener,closer", [("(", ")"), ("[", "]"), ("{'a':", "}"), ("-", "")])
def test_ten_thousand_deep_nesting_is_a_clear_error(opener: str, closer: str) -> None:
    source = opener * 10_000 + "1" + closer * 10_000
    with pytest.raises(JSONataError) as info:
        jsonata.compile(source)
    assert info.value.code == "U1002"
    assert "split it into variables" in str(info.value)


def test_runaway_recursion_hits_the_depth_budget() -> None:
    expr = jsonata.compile("($f := function($n) { $n + $f($n + 1) }; $f(0))")
    with pytest.raises(JSONataError) as info:
        expr.evaluate(None, budget=Budget(max_depth=50))
    assert info.value.code == "U1001"
    assert "max_depth" in str(info.value)


def test_infinite_tail_recursion_hits_the_step_budget() -> None:
    expr = jsonata.compile("($f := function($n) { $f($n + 1) }; $f(0))")
    with pytest.raises(JSONataError) as info:
        expr.evaluate(None, budget=Budget(max_steps=10_000, max_time_ms=60_000))
    assert info.value.code == "U1001"
    assert "max_steps" in str(info.value)


def test_huge_output_hits_the_length_budget() -> None:
    doubling = jsonata.compile(
        '($f := function($s, $n) { $n = 0 ? $s : $f($s & $s, $n - 1) }; $f("x", 40))'
    )
    with pytest.raises(JSONataError) as info:
        doubling.evaluate(None, budget=Budget(max_length=1_000_000))
    assert info.value.code == "U1003"
    with pytest.raises(JSONataError) as info:
        jsonata.compile("[1..100000000]").evaluate(None)
    assert info.value.code == "D2014"
    with pytest.raises(JSONataError) as info:
        jsonata.compile("$count([1..5000000])").evaluate(None, budget=Budget(max_length=1_000_000))
    assert info.value.code == "U1003"


def test_regex_is_linear() -> None:
    expr = jsonata.compile("$contains($, /(a+)+$/)")
    assert expr.evaluate("a" * 50_000 + "!") is False  # catastrophic for a backtracking engine


def test_concurrent_evaluation_from_threads() -> None:
    expr = jsonata.compile('$map(items, function($v, $i) { {"i": $i, "sq": $v * $v, "n": $n} })')
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for _ in range(50):
                out = expr.evaluate({"items": list(range(n % 7 + 2))}, {"n": n})
                assert all(o["n"] == n for o in out)
            results[n] = out
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results[3] == [{"i": i, "sq": i * i, "n": 3} for i in range(5)]


def test_unforeseen_values_fail_the_evaluation_clearly() -> None:
    with pytest.raises(JSONataError) as info:
        jsonata.compile("$split('some text', $uppercase)").evaluate(None)
    assert info.value.code == "T1010"
    assert "custom matcher functions are not supported" in str(info.value)
    with pytest.raises(JSONataError) as info:
        jsonata.compile('{"inf": 1/0}').evaluate(None)
    assert info.value.code == "D1001"


def test_ten_thousand_deep_data_works_or_fails_clearly() -> None:
    deep: object = "leaf"
    for _ in range(10_000):
        deep = {"a": deep}
    assert jsonata.compile("$count(**)").evaluate(deep) == 10_001  # iterative descent
    try:
        text = jsonata.compile("$string($)").evaluate(deep)
    except JSONataError as exc:
        assert exc.code == "U1001" and "Stack overflow" in str(exc)
    else:
        assert text.count("{") == 10_000


def test_deep_data_compares_and_tests_truth_without_the_c_stack() -> None:
    a: object = 1
    b: object = 1
    for _ in range(5_000):
        a, b = [a], [b]
    assert jsonata.compile("$a = $b").evaluate(None, {"a": a, "b": b}) is True
    assert jsonata.compile("$boolean($a)").evaluate(None, {"a": a}) is True
