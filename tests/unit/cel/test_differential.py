"""Differential test: eventbus.cel against cel-expr-python (Google's C++ CEL).

Hypothesis generates expressions (arithmetic, comparisons, logic, strings,
lists, maps, macros) over literals and variables bound to JSON-like values;
both implementations must agree on the value (with its type) or both fail.
The reference runs unchecked (``disable_check=True``), which is CEL's dynamic
semantics, the same as ``cel.compile`` without declared variables.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus import cel

ref = __import__("cel_expr_python.cel", fromlist=["cel"])
ref_ext_strings = __import__("cel_expr_python.ext.ext_strings", fromlist=["ExtStrings"])
ref_ext_math = __import__("cel_expr_python.ext.ext_math", fromlist=["ExtMath"])

VARIABLES: dict[str, Any] = {
    "i": 7,
    "n": -3,
    "f": 2.5,
    "s": "hello",
    "b": True,
    "z": None,
    "l": [1, 2, 3],
    "ls": ["a", "bc"],
    "m": {"a": 1, "b": "x", "c": [1, 2]},
}
_ENV = ref.NewEnv(
    variables=dict.fromkeys(VARIABLES, ref.Type.DYN),
    extensions=[ref_ext_strings.ExtStrings(), ref_ext_math.ExtMath()],
)

_INT_LEAF = st.sampled_from(["0", "1", "2", "-1", "7", "9223372036854775807", "i", "n", "m.a"])
# (no uint variable: cel-expr-python receives Python ints as CEL ints)
_UINT_LEAF = st.sampled_from(["0u", "1u", "5u", "18446744073709551615u"])
_DOUBLE_LEAF = st.sampled_from(["0.0", "1.5", "-2.25", "1e300", "f", "0.1", "-0.0"])
_STR_LEAF = st.sampled_from(["''", "'a'", "'hello'", "s", "m.b", "ls[1]", "'\\u00e9'", "'l'"])
_BOOL_LEAF = st.sampled_from(["true", "false", "b"])
_LIST_LEAF = st.sampled_from(["[]", "[1, 2]", "l", "ls", "m.c", "[1, 'a', 2.0]", "[1u, 2.0]"])
_MAP_LEAF = st.sampled_from(["{}", "{'a': 1}", "m", "{1: 'x', 2u: 'y'}", "{'k': [1]}"])
_OTHER_LEAF = st.sampled_from(["z", "null", "m.missing", "l[5]", "1 / 0"])


def _bin(
    a: st.SearchStrategy[str], ops: list[str], b: st.SearchStrategy[str]
) -> st.SearchStrategy[str]:
    return st.tuples(a, st.sampled_from(ops), b).map(lambda t: f"({t[0]} {t[1]} {t[2]})")


def _call(templates: list[str], *args: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.tuples(st.sampled_from(templates), *args).map(lambda t: t[0].format(*t[1:]))


_ARITH = ["+", "-", "*", "/", "%"]
_CMP = ["==", "!=", "<", "<=", ">", ">="]

INTS = st.deferred(
    lambda: st.one_of(
        _INT_LEAF,
        _bin(INTS, _ARITH, INTS),
        _call(["size({})", "{}.size()", "{}.indexOf('l')"], STRS),
        _call(["size({})"], LISTS),
        _call(["int({})"], st.one_of(DOUBLES, UINTS, STRS)),
        _call(["-({})", "math.abs({})", "math.sign({})"], INTS),
        _call(["({} ? {} : {})"], BOOLS, INTS, INTS),
        _call(["{}[0]"], LISTS),
    )
)
UINTS = st.deferred(
    lambda: st.one_of(
        _UINT_LEAF,
        _bin(UINTS, _ARITH, UINTS),
        _call(["uint({})"], st.one_of(INTS, DOUBLES)),
    )
)
DOUBLES = st.deferred(
    lambda: st.one_of(
        _DOUBLE_LEAF,
        _bin(DOUBLES, ["+", "-", "*", "/"], DOUBLES),
        _call(["double({})"], st.one_of(INTS, UINTS)),
        _call(["math.floor({})", "math.round({})", "-({})"], DOUBLES),
    )
)
STRS = st.deferred(
    lambda: st.one_of(
        _STR_LEAF,
        _bin(STRS, ["+"], STRS),
        _call(["string({})"], st.one_of(INTS, UINTS, DOUBLES, BOOLS, STRS)),
        _call(["{}.upperAscii()", "{}.trim()", "{}.reverse()", "{}.replace('l', 'L')"], STRS),
        _call(["{}.substring(1)", "{}.charAt(0)"], STRS),
        _call(["({} ? {} : {})"], BOOLS, STRS, STRS),
        _call(["{}.join('-')"], LISTS),
    )
)
ANY = st.deferred(lambda: st.one_of(INTS, UINTS, DOUBLES, STRS, BOOLS, LISTS, MAPS, _OTHER_LEAF))
BOOLS = st.deferred(
    lambda: st.one_of(
        _BOOL_LEAF,
        _bin(INTS, _CMP, st.one_of(INTS, UINTS, DOUBLES)),
        _bin(DOUBLES, _CMP, st.one_of(INTS, DOUBLES)),
        _bin(STRS, _CMP, STRS),
        _bin(ANY, ["==", "!="], ANY),
        _bin(BOOLS, ["&&", "||"], st.one_of(BOOLS, ANY)),
        _bin(ANY, ["&&", "||"], BOOLS),
        _call(["!({})"], BOOLS),
        _call(["{} in {}"], ANY, st.one_of(LISTS, MAPS)),
        _call(
            ["{}.contains({})", "{}.startsWith({})", "{}.endsWith({})", "{}.matches({})"],
            STRS,
            STRS,
        ),
        _call(["has({}.a)", "has({}.b)"], MAPS),
        _call(["{}.all(e, {})", "{}.exists(e, {})", "{}.exists_one(e, {})"], LISTS, BOOLS),
        _call(["l.exists(e, e > {})", "l.all(e, e != {})", "ls.exists(e, e == {})"], ANY),
    )
)
LISTS = st.deferred(
    lambda: st.one_of(
        _LIST_LEAF,
        _bin(LISTS, ["+"], LISTS),
        st.lists(ANY, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        _call(["l.map(e, e * {})", "l.filter(e, e > {})", "l.map(e, e > 1, {})"], INTS),
        _call(["{}.split('l')"], STRS),
    )
)
MAPS = st.deferred(
    lambda: st.one_of(
        _MAP_LEAF,
        st.lists(st.tuples(st.one_of(STRS, INTS, BOOLS), ANY), max_size=2).map(
            lambda kvs: "{" + ", ".join(f"{k}: {v}" for k, v in kvs) + "}"
        ),
    )
)
EXPRESSIONS = st.one_of(INTS, UINTS, DOUBLES, STRS, BOOLS, LISTS, MAPS, ANY)


def _ours(source: str) -> tuple[str, Any]:
    try:
        return "ok", cel.compile(source).evaluate(VARIABLES)
    except cel.CELError:
        return "error", None


def _reference(source: str) -> tuple[str, Any]:
    try:
        result = _ENV.compile(source, disable_check=True).eval(data=VARIABLES)
    except Exception:
        return "error", None
    if result.type() == ref.Type.ERROR:
        return "error", None
    value = result.plain_value()
    if result.type() == ref.Type.UINT:
        value = cel.UInt(value)
    return "ok", value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(b, bytearray):
        b = bytes(b)
    if type(a) is cel.UInt or type(b) is cel.UInt:
        return type(a) is type(b) and a == b
    return type(a) is type(b) and a == b


def _same_nested(a: Any, b: Any) -> bool:
    """As _same, but the reference's plain values lose uint inside containers."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_nested(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_nested(a[k], b[k]) for k in a)
    if type(a) is cel.UInt and type(b) is int:
        return a == b
    return _same(a, b)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(EXPRESSIONS)
def test_matches_cel_expr_python(source: str) -> None:
    ours = _ours(source)
    theirs = _reference(source)
    assert ours[0] == theirs[0], f"{source!r}: eventbus.cel {ours}, cel-expr-python {theirs}"
    if ours[0] == "ok":
        same = _same_nested if isinstance(ours[1], list | dict) else _same
        assert same(ours[1], theirs[1]), f"{source!r}: {ours[1]!r} != {theirs[1]!r}"


def test_reference_is_reachable() -> None:
    assert _reference("1 + 2") == ("ok", 3)
    assert _reference("1 / 0") == ("error", None)
