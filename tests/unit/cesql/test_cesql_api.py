"""The public API of eventbus.cesql: errors pickle (they cross Ray actors), values of every
attribute type are read in their CloudEvents forms, and ``matches`` is a predicate."""

from __future__ import annotations

import datetime
import pickle

import pytest

from eventbus import cesql


def test_errors_pickle_with_their_kind_and_position() -> None:
    with pytest.raises(cesql.CESQLError) as info:
        cesql.compile("a =\n  AND b")
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.kind, copy.line, copy.column) == ("parse", 2, 3)
    assert str(copy).startswith("line 2, column 3: expected a value")
    with pytest.raises(cesql.CESQLError) as info:
        cesql.compile("INT(n) > 1").matches({"n": "x"})
    copy = pickle.loads(pickle.dumps(info.value))
    assert isinstance(copy, cesql.CESQLError) and copy.kind == "cast"


def test_attribute_values_of_other_types_are_read_as_strings() -> None:
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    prog = cesql.compile("time LIKE '2026-01-02T03:04:05%' AND seq = 7 AND big = '9999999999'")
    assert prog.matches({"time": when, "seq": 7, "big": 9_999_999_999}) is True


def test_evaluate_gives_the_value_and_every_error() -> None:
    value, errors = cesql.compile("NOT 10").evaluate({})
    assert value is True and [e.kind for e in errors] == ["cast"]
    assert cesql.compile("CONCAT(a, '-', b)").evaluate({"a": "x", "b": 1}) == ("x-1", [])


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("IS_INT('42')", True),
        ("IS_INT('-2147483648')", True),
        ("IS_INT('2147483648')", False),
        ("IS_INT('4x')", False),
        ("IS_INT(TRUE)", True),  # INT(TRUE) is 1
        ("IS_BOOL('fAlSe')", True),
        ("IS_BOOL('yes')", False),
        ("IS_BOOL(0)", True),  # BOOL(0) is false
        ("IS_INT(missing)", False),  # a missing attribute: the error, and the zero value
    ],
)
def test_is_int_and_is_bool_tell_whether_the_cast_succeeds(source: str, value: bool) -> None:
    got, errors = cesql.compile(source).evaluate({})
    assert got is value
    assert [e.kind for e in errors] == (["missingAttribute"] if "missing" in source else [])
