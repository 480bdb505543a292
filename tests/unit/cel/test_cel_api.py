"""The eventbus.cel API contract: errors, positions, pickling, semantics."""

from __future__ import annotations

import datetime as dt
import pickle
import re

import pytest

from eventbus import cel

EVENT = {
    "type": "payment.created",
    "source": "/payments",
    "data": {"amount": 150, "currency": "USD", "tags": ["a", "b"], "price": 9.5},
}


def test_public_surface() -> None:
    assert cel.__all__ == sorted(cel.__all__)
    assert set(cel.__all__) == {"CELError", "Program", "UInt", "compile"}


def test_typical_filter() -> None:
    prog = cel.compile(
        "type == 'payment.created' && data.amount > 100 && data.currency in ['CNY', 'USD']"
    )
    assert prog.evaluate(EVENT) is True
    assert prog.evaluate({**EVENT, "type": "payment.refunded"}) is False
    assert prog.source.startswith("type ==")


def test_variables_are_the_referenced_top_level_identifiers() -> None:
    prog = cel.compile("type == 'x' && data.tags.exists(t, t == source) && type(1) == int")
    assert prog.variables == frozenset({"type", "data", "source"})
    assert cel.compile("[1, 2].map(x, x * 2)").variables == frozenset()
    assert cel.compile("cel.bind(y, 1, y + z)").variables == frozenset({"z"})


@pytest.mark.parametrize(
    ("source", "column", "message"),
    [
        ("1 +", 4, "syntax error: unexpected end of input"),
        ("data.amount >", 14, "syntax error: unexpected end of input"),
        ("(1 + 2", 7, "syntax error: expected ')', got end of input"),
        ("a ! b", 3, "syntax error: unexpected '!'"),
        ("'abc", 1, "unterminated string literal"),
        ("1 = 2", 3, "unexpected character '='"),
        ("9223372036854775808", 1, "int literal out of range"),
        ("18446744073709551616u", 1, "uint literal out of range"),
        ("x.all(1, true)", 7, "macro variable must be a simple identifier"),
        ("has(x)", 5, "invalid argument to has() macro"),
        ("'\\q'", 2, "invalid escape sequence '\\q'"),
        ("if", 1, "reserved identifier 'if'"),
    ],
)
def test_compile_error_columns(source: str, column: int, message: str) -> None:
    with pytest.raises(cel.CELError) as info:
        cel.compile(source)
    err = info.value
    assert err.column == column
    assert err.message == message
    assert err.expression == source
    assert str(err) == f"column {column}: {message}"


def test_undeclared_variable_with_hint() -> None:
    expect = "column 16: undeclared reference to 'dta' (did you mean 'data'?)"
    with pytest.raises(cel.CELError, match=re.escape(expect)):
        cel.compile("type == 'a' && dta.amount > 1", variables=["type", "data"])
    prog = cel.compile("type == 'a' && data.amount > 1", variables=["type", "data", "id"])
    assert prog.variables == frozenset({"type", "data"})


def test_undeclared_variable_without_declarations_fails_at_run_time() -> None:
    prog = cel.compile("dta.amount > 1")
    with pytest.raises(cel.CELError, match="undeclared reference to 'dta'") as info:
        prog.evaluate(EVENT)
    assert info.value.column is None


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("sise(data)", "undeclared reference to function 'sise' (did you mean 'size'?)"),
        ("data.startswith('a')", "undeclared reference to function 'startswith'"),
        ("size(1, 2)", "function 'size' takes 1 argument(s); got 2"),
        ("'a'.contains()", "function 'contains' takes 1 argument(s); got 0"),
        ("math.nope(1)", "undeclared reference to function 'nope'"),
    ],
)
def test_unknown_functions_and_arity(source: str, message: str) -> None:
    with pytest.raises(cel.CELError, match=re.escape(message)):
        cel.compile(source)


def test_reserved_receiver_function_names_fail_at_run_time() -> None:
    assert cel.compile("a.while() || true").evaluate({}) is True
    with pytest.raises(cel.CELError, match="no matching overload"):
        cel.compile("'a'.while()").evaluate({})


def test_cel_error_pickles_and_is_a_value_error() -> None:
    err = cel.CELError("bad thing", "1 +", 4)
    assert isinstance(err, ValueError)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.message, copy.expression, copy.column) == ("bad thing", "1 +", 4)
    assert str(copy) == "column 4: bad thing"
    runtime = cel.CELError("division by zero")
    assert str(pickle.loads(pickle.dumps(runtime))) == "division by zero"


def test_program_pickles() -> None:
    prog = cel.compile("data.amount * 2", variables=["data"])
    copy = pickle.loads(pickle.dumps(prog))
    assert copy.evaluate(EVENT) == 300
    assert copy.variables == prog.variables
    assert copy.source == prog.source
    with pytest.raises(cel.CELError):
        cel.compile("dta", variables=["data"])


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("data.missing && false", False),
        ("false && data.missing", False),
        ("data.missing || true", True),
        ("true || data.missing", True),
        ("1 / 0 == 1 || true", True),
        ("data.amount == 'x' || data.currency == 'USD'", True),
        ("data.tags.exists(t, t.missing || t == 'b')", True),
        ("data.tags.all(t, t > 1 && false)", False),
        ("[1, 'a'].exists(x, x > 0)", True),
        ("['a', 1].exists(x, x > 0)", True),
        ("['a', 0].all(x, x > 0)", False),
        ("true ? 1 : 1 / 0", 1),
        ("false ? 1 / 0 : 2", 2),
        ("32 && false", False),
    ],
)
def test_error_absorption(source: str, expected: object) -> None:
    assert cel.compile(source).evaluate(EVENT) == expected


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("data.missing && true", "no such key: 'missing'"),
        ("data.missing || false", "no such key: 'missing'"),
        ("data.amount > 'a'", "no matching overload for '_>_' applied to (int, string)"),
        ("data.amount / 0", "division by zero"),
        ("data.amount % 0", "modulus by zero"),
        ("data.price % 2.0", "no matching overload for '_%_' applied to (double, double)"),
        ("data.amount * 1.5", "no matching overload for '_*_' applied to (int, double)"),
        ("data.tags[5]", "index out of range: 5"),
        ("data.tags.all(t, t > 1)", "no matching overload"),
        ("1 / 0 > 4 ? 'a' : 'b'", "division by zero"),
        ("32 && true", "no matching overload for '_&&_' applied to (int)"),
    ],
)
def test_runtime_errors_are_cel_errors(source: str, message: str) -> None:
    prog = cel.compile(source)
    with pytest.raises(cel.CELError, match=re.escape(message)) as info:
        prog.evaluate(EVENT)
    assert info.value.column is None
    assert info.value.expression is None


@pytest.mark.parametrize(
    ("source", "x"),
    [
        ("x + 1", 2**63 - 1),
        ("x - 1", -(2**63)),
        ("x * 2", 2**62),
        ("-x", -(2**63)),
        ("x / -1", -(2**63)),
        ("int(x)", 2.0**63),
        ("x + 1u", cel.UInt(2**64 - 1)),
        ("x - 1u", cel.UInt(0)),
        ("x * 2u", cel.UInt(2**63)),
    ],
)
def test_64_bit_overflow(source: str, x: object) -> None:
    with pytest.raises(cel.CELError, match="overflow"):
        cel.compile(source).evaluate({"x": x})


def test_int_range_edges() -> None:
    assert cel.compile("x + 0").evaluate({"x": 2**63 - 1}) == 2**63 - 1
    assert cel.compile("-9223372036854775808").evaluate({}) == -(2**63)
    assert cel.compile("x + 1u").evaluate({"x": cel.UInt(1)}) == cel.UInt(2)
    assert type(cel.compile("x + 1u").evaluate({"x": cel.UInt(1)})) is cel.UInt


def test_uint_is_distinct_from_int() -> None:
    with pytest.raises(ValueError, match="uint out of range"):
        cel.UInt(-1)
    assert cel.compile("1u == 1").evaluate({}) is True
    with pytest.raises(cel.CELError):
        cel.compile("1u + 1").evaluate({})
    assert repr(cel.UInt(3)) == "UInt(3)"
    assert pickle.loads(pickle.dumps(cel.UInt(3))) == 3


def test_bool_and_int_map_keys_are_distinct() -> None:
    assert cel.compile("true in {1: 'a'}").evaluate({}) is False
    assert cel.compile("1 in {true: 'a'}").evaluate({}) is False
    assert cel.compile("{true: 'a'}[true]").evaluate({}) == "a"
    with pytest.raises(cel.CELError, match="no such key"):
        cel.compile("{1: 'a'}[true]").evaluate({})
    assert cel.compile("x == 1").evaluate({"x": True}) is False
    assert cel.compile("x in [1, 2]").evaluate({"x": True}) is False
    assert cel.compile("x > 0").evaluate({"x": 1}) is True
    with pytest.raises(cel.CELError):
        cel.compile("x > 0").evaluate({"x": True})


def test_heterogeneous_numbers() -> None:
    assert cel.compile("1 == 1.0 && 1u == 1.0 && 2u > 1 && 1.5 < 2").evaluate({}) is True
    assert cel.compile("[1, 2.0] == [1.0, 2u]").evaluate({}) is True
    assert cel.compile("x in [1, 2]").evaluate({"x": 2.0}) is True


def test_json_like_and_python_inputs() -> None:
    assert cel.compile("x[1] + size(x)").evaluate({"x": (1, 2, 3)}) == 5
    assert cel.compile("x.a.b").evaluate({"x": {"a": {"b": None}}}) is None
    assert cel.compile("x + [3]").evaluate({"x": (1, 2)}) == [1, 2, 3]
    assert cel.compile("x == null").evaluate({"x": None}) is True


def test_timestamps_and_durations() -> None:
    t = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    prog = cel.compile("time > timestamp('2024-01-01T00:00:00Z') && time.getHours() == 3")
    assert prog.evaluate({"time": t}) is True
    later = cel.compile("time + duration('1h30m')").evaluate({"time": t})
    assert later == t + dt.timedelta(hours=1, minutes=30)
    assert cel.compile("string(time)").evaluate({"time": t}) == "2024-01-02T03:04:05Z"
    assert cel.compile("time.getHours('America/New_York')").evaluate({"time": t}) == 22
    delta = cel.compile("d * 1").evaluate
    with pytest.raises(cel.CELError):
        delta({"d": dt.timedelta(seconds=1)})


def test_type_identifier_is_the_variable_and_type_call_is_the_builtin() -> None:
    assert cel.compile("type").evaluate({"type": "t"}) == "t"
    assert cel.compile("type(type) == string").evaluate({"type": "t"}) is True
    assert cel.compile("type(1) == int && type(1u) == uint").evaluate({}) is True
    assert cel.compile("type(x) == map").evaluate({"x": {}}) is True


def test_fast_and_slow_paths_agree_on_guarded_inline_code() -> None:
    prog = cel.compile("x * 7.1")
    assert prog.evaluate({"x": 2.0}) == 2.0 * 7.1
    with pytest.raises(cel.CELError):
        prog.evaluate({"x": 2})
    prog = cel.compile("x + ':' + string(y)")
    assert prog.evaluate({"x": "a", "y": 3}) == "a:3"
    assert prog.evaluate({"x": "a", "y": 1.5}) == "a:1.5"
    assert prog.evaluate({"x": "a", "y": True}) == "a:true"
    with pytest.raises(cel.CELError):
        prog.evaluate({"x": 1, "y": 1})


def test_evaluation_never_leaks_python_exceptions() -> None:
    prog = cel.compile("x.y")
    for value in (None, 1, "s", [1], b"b", 1.5, True):
        with pytest.raises(cel.CELError):
            prog.evaluate({"x": value})
    with pytest.raises(cel.CELError):
        prog.evaluate(None)  # type: ignore[arg-type]


def test_strings_and_math_extensions() -> None:
    assert cel.compile("'a,b'.split(',').join('-')").evaluate({}) == "a-b"
    assert cel.compile("'%s=%d'.format(['n', 3])").evaluate({}) == "n=3"
    assert cel.compile("math.greatest(1, 2.5, 2u)").evaluate({}) == 2.5
    assert cel.compile("'ab'.matches('^a')").evaluate({}) is True
    assert cel.compile("cel.bind(t, 'ab', t + t)").evaluate({}) == "abab"


def test_deep_nesting_is_a_compile_error_not_a_crash() -> None:
    with pytest.raises(cel.CELError, match="nesting"):
        cel.compile("(" * 300 + "1" + ")" * 300)
    with pytest.raises(cel.CELError, match="nesting"):
        cel.compile(" + ".join(["x"] * 150))
    assert cel.compile(" + ".join(["x"] * 60)).evaluate({"x": 1}) == 60
    assert cel.compile(" && ".join(["x"] * 500)).evaluate({"x": True}) is True
