"""CloudEvents SQL against hostile input: huge and deep expressions, pathological LIKE
patterns, non-ASCII, string growth, threads. Each gets a clear CESQLError (never a
RecursionError or a hang) or the right answer."""

from __future__ import annotations

import re
import threading

import pytest

from eventbus import cesql
from eventbus.cesql._values import MAX_LIKE_STEPS


def test_a_megabyte_expression_is_refused_with_the_limit() -> None:
    source = " OR ".join(["type = 'x'"] * 80_000)  # ~1 MB
    assert len(source) > 1_000_000
    with pytest.raises(cesql.CESQLError, match=re.escape("the maximum is 100,000")) as info:
        cesql.compile(source)
    assert info.value.kind == "parse"


def test_a_long_chain_of_one_operator_costs_no_depth() -> None:
    source = " OR ".join(f"type = 't{i}'" for i in range(5_000))  # under 100,000 characters
    prog = cesql.compile(source)
    assert prog.matches({"type": "t4999"}) is True
    assert prog.matches({"type": "nope"}) is False
    assert cesql.compile(" + ".join(["1"] * 10_000)).value({}) == 10_000


def test_ten_thousand_nested_parentheses_are_a_clear_error() -> None:
    source = "(" * 10_000 + "TRUE" + ")" * 10_000
    with pytest.raises(cesql.CESQLError, match="nests deeper than 48 levels") as info:
        cesql.compile(source)
    assert (info.value.kind, info.value.line, info.value.column) == ("parse", 1, 49)


@pytest.mark.parametrize("prefix", ["NOT ", "-", "ABS(", "a AND (b OR "])
def test_deep_unary_calls_and_alternations_are_clear_errors(prefix: str) -> None:
    with pytest.raises(cesql.CESQLError, match="nests deeper than"):
        cesql.compile(prefix * 5_000 + "1")


def test_alternating_operators_are_bounded() -> None:
    source = " AND ".join(f"(a OR b{i})" for i in range(60))  # flat: fine
    assert cesql.compile(source).matches({"a": "true"}) is True
    chain = "".join(f"a{i} AND b{i} OR " for i in range(1_000)) + "c"
    with pytest.raises(cesql.CESQLError, match="nests deeper than"):
        cesql.compile(chain)


def test_pathological_like_patterns_run_in_linear_time() -> None:
    # a backtracking matcher takes exponential time here; pieces matched leftmost do not
    value = "a" * 200_000
    pattern = "%a" * 30 + "%b"
    prog = cesql.compile(f"x LIKE '{pattern}'")
    assert prog.matches({"x": value}) is False
    assert prog.matches({"x": value + "b"}) is True
    underscores = cesql.compile("x LIKE '%" + "a_" * 20 + "b%'")
    assert underscores.matches({"x": value}) is False


def test_like_with_wildcards_on_huge_values_has_a_budget() -> None:
    pattern = "%" + "_" * 100 + "x%"
    prog = cesql.compile(f"x LIKE '{pattern}'")
    value = "a" * (MAX_LIKE_STEPS // 100 + 1)
    with pytest.raises(cesql.CESQLError, match="exceeds the budget") as info:
        prog.matches({"x": value})
    assert info.value.kind == "generic"


def test_string_growth_is_budgeted_across_the_expression() -> None:
    big = "x" * 1_000_000
    concat = ", ".join(["s"] * 20)
    prog = cesql.compile(f"LENGTH(CONCAT({concat})) > 0")
    with pytest.raises(cesql.CESQLError, match="over this expression's budget") as info:
        prog.matches({"s": big})
    assert info.value.kind == "generic"
    value, errors = prog.evaluate({"s": big})
    assert value is False and errors[0].kind == "generic"
    small = cesql.compile(f"LENGTH(CONCAT({concat}))", max_output_size=10_000)
    assert small.value({"s": "ab"}) == 40


def test_non_ascii_values_and_patterns() -> None:
    prog = cesql.compile("subject LIKE 'z_rich-%' AND LENGTH(subject) = 9 AND UPPER(x) = 'STRASSE'")
    assert prog.matches({"subject": "zürich-日本", "x": "straße"}) is True
    assert cesql.compile("LEFT(s, 2)").value({"s": "日本語"}) == "日本"
    with pytest.raises(cesql.CESQLError, match="unexpected character 'é'") as info:
        cesql.compile("type = 'a' AND é = 1")
    assert (info.value.line, info.value.column) == (1, 16)


def test_parse_errors_name_the_token_line_and_fix() -> None:
    with pytest.raises(cesql.CESQLError) as info:
        cesql.compile("type = 'a'\nAND source LIKE 5")
    err = info.value
    assert (err.kind, err.line, err.column) == ("parse", 2, 17)
    assert "a string literal pattern after LIKE" in err.message and "'5'" in err.message
    with pytest.raises(cesql.CESQLError, match="unterminated string"):
        cesql.compile("type = 'abc")
    with pytest.raises(cesql.CESQLError, match=r"LEFT takes 2 arguments; got 1") as info:
        cesql.compile("LEFT('a')")
    assert info.value.kind == "missingFunction"
    with pytest.raises(cesql.CESQLError, match="out of range"):
        cesql.compile("x = 2147483648")


def test_keywords_functions_and_attribute_names_are_case_insensitive() -> None:
    prog = cesql.compile("Type like 'A%' aNd exists SUBJECT and lower(TYPE) = 'ab'")
    assert prog.matches({"type": "Ab", "subject": "s"}) is True


def test_a_filter_must_give_a_boolean() -> None:
    with pytest.raises(cesql.CESQLError, match="not a Boolean"):
        cesql.compile("LENGTH(type)").matches({"type": "abc"})


def test_concurrent_evaluation_from_threads() -> None:
    prog = cesql.compile("INT(n) % 7 = 3 AND type LIKE 'order.%' AND s IN ('a', 'b')")
    failures: list[str] = []

    def work(offset: int) -> None:
        for i in range(offset, offset + 3_000):
            attrs = {"n": str(i), "type": "order.x", "s": "a" if i % 2 else "c"}
            expected = i % 7 == 3 and i % 2 == 1
            if prog.matches(attrs) is not expected:
                failures.append(f"{i}")
            value, errors = prog.evaluate({"type": "x"})  # missing n: an error each time
            if value is not False or [e.kind for e in errors] != ["missingAttribute"]:
                failures.append(f"errors {i}")

    threads = [threading.Thread(target=work, args=(k * 10_000,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
