"""Hostile CEL source: every input compiles or raises CELError with a position, quickly.

Before, some inputs escaped as Python exceptions (AssertionError for non-ASCII digits,
ValueError for 5,000-digit literals, RecursionError for 99 nested brackets) and crashed
``eventbus validate``.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus import cel
from eventbus.cel._parser import MAX_EXPRESSION_LENGTH

# name -> (source, expected message part, expected column or None for any)
CASES: dict[str, tuple[str, str, int | None]] = {
    "arabic-indic digits": ("1\u0663\u0664", "invalid number literal", 1),
    "fullwidth digits": ("\uff11\uff12 + 1", "unexpected character '１'", 1),
    "devanagari digit first": ("x + \u0967", "unexpected character", 5),
    "5,000-digit int": ("1" * 5000, "int literal out of range", 1),
    "5,000-digit uint": ("1" * 5000 + "u", "uint literal out of range", 1),
    "5,000-digit negative int": ("-" + "9" * 5000, "int literal out of range", 2),
    "5,000-digit hex": ("0x" + "f" * 5000, "int literal out of range", 1),
    "leading zeros then in range": ("0" * 5000 + "12 == 13", "", None),
    "99 nested [": ("[" * 99, "nesting exceeds the maximum depth", 51),
    "99 nested [ closed": ("[" * 99 + "]" * 99, "nesting exceeds the maximum depth", 51),
    "99 nested {": ("{1:" * 99 + "1" + "}" * 99, "nesting exceeds the maximum depth", None),
    "5,000 parentheses": ("(" * 5000 + "1" + ")" * 5000, "nesting exceeds the maximum depth", 51),
    "5,000 '!'": ("!" * 5000 + "true", "nesting exceeds the maximum depth", 51),
    "5,000 '-'": ("-" * 5000 + "1", "nesting exceeds the maximum depth", 51),
    "5,000 '-' on a variable": ("-" * 5000 + "x", "nesting exceeds the maximum depth", 51),
    "nested calls": ("f(" * 500 + ")" * 500, "nesting exceeds the maximum depth", None),
    "nested comprehensions": (
        "[1].map(x, " * 60 + "x" + ")" * 60,
        "nesting exceeds the maximum depth",
        None,
    ),
    "deep member chain": ("a" + ".b" * 10_000, "nesting exceeds the maximum depth", None),
    "deep index chain": ("a" + "[0]" * 10_000, "nesting exceeds the maximum depth", None),
    "deep call chain": ("a" + ".size()" * 5_000, "nesting exceeds the maximum depth", None),
    "long + chain": (" + ".join(["1"] * 10_000), "nesting exceeds the maximum depth", None),
    "1 MB expression": ("a + " * 250_000 + "a", "the limit is 100,000", 100_001),
    "1 MB string literal": ("'" + "a" * 1_000_000 + "'", "the limit is 100,000", 100_001),
    "many escapes": ("'" + "\\u00e9" * 200_000 + "'", "the limit is 100,000", 100_001),
    "bad escape at the end": ("'" + "\\u00e9" * 10_000 + "\\q'", "invalid escape sequence", None),
    "NUL": ("\x00", "unexpected character", 1),
    "unterminated triple quote": ("'''" + "a" * 50_000, "unterminated string literal", 1),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_hostile_source_is_a_cel_error_with_a_position(case: str) -> None:
    source, message, column = CASES[case]
    start = time.perf_counter()
    if not message:
        cel.compile(source)
    else:
        with pytest.raises(cel.CELError) as info:
            cel.compile(source)
        assert message in info.value.message
        assert info.value.column is not None
        if column is not None:
            assert info.value.column == column
    assert time.perf_counter() - start < 5.0  # seconds under load; was minutes


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("1e99999999", float("inf")),
        ("-1e99999999", float("-inf")),
        ("1e-99999999", 0.0),
        ("1" * 5000 + ".5 > 0.0", True),
        ("0x" + "0" * 100 + "ff", 255),
        ("((((((((((((((((((((((((((((((((7))))))))))))))))))))))))))))))))", 7),  # cel-spec
        ("!" * 32 + "true", True),
        ("-" * 31 + "(1)", -1),
    ],
)
def test_extreme_but_valid_literals_compile(source: str, expected: object) -> None:
    assert cel.compile(source).evaluate({}) == expected


def test_the_length_limit_is_the_only_one_a_long_flat_expression_meets() -> None:
    # A flat list literal just under the limit compiles (in about a second).
    count = (MAX_EXPRESSION_LENGTH - 8) // 2
    source = f"size([ {','.join(['1'] * count)}])"
    assert len(source) == MAX_EXPRESSION_LENGTH
    start = time.perf_counter()
    assert cel.compile(source).evaluate({}) == count
    assert time.perf_counter() - start < 10.0
    with pytest.raises(cel.CELError, match="expression is 100,001 characters long"):
        cel.compile(source + " ")


def test_deep_caller_stack_still_gets_a_cel_error() -> None:
    # The nesting limit keeps the parser inside Python's recursion limit; a caller that
    # already used most of the stack gets a CELError, not a RecursionError.
    def nested(depth: int) -> None:
        if depth:
            nested(depth - 1)
            return
        with pytest.raises(cel.CELError, match="nest"):
            cel.compile("[" * 45 + "]" * 45)

    import sys

    nested(sys.getrecursionlimit() - 250)


_CEL_ALPHABET = st.sampled_from(
    [
        *"()[]{}!-+*/%<>=&|?:.,'\"\\ \n\tabrxuU019eE_`",
        *["true", "false", "null", "in", ".map(x,", ".all(x,", "has(", "size(", "\u0663", "é"],
    ]
)


def _compile_quickly(source: str) -> None:
    start = time.perf_counter()
    try:
        program = cel.compile(source)
    except cel.CELError as err:
        assert err.column is not None
        assert isinstance(err.message, str)
    else:
        try:
            program.evaluate({"a": 1, "x": [1], "b": "s"})
        except cel.CELError:
            pass
    assert time.perf_counter() - start < 5.0  # seconds under load; was minutes


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.text(max_size=200))
def test_random_text_compiles_or_raises_cel_error(source: str) -> None:
    _compile_quickly(source)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_CEL_ALPHABET, max_size=300).map("".join))
def test_random_cel_like_text_compiles_or_raises_cel_error(source: str) -> None:
    _compile_quickly(source)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_compile_or_raise_cel_error(raw: bytes) -> None:
    _compile_quickly(raw.decode("utf-8", "surrogateescape"))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["(", "[", "!", "-", "a.b(", "{1:", "[1].map(x,", "true ? 1 : "]),
    st.integers(min_value=1, max_value=3000),
)
def test_random_deep_nesting_compiles_or_raises_cel_error(opener: str, depth: int) -> None:
    _compile_quickly(opener * depth + "1")
