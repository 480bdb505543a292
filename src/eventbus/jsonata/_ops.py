"""Operators: arithmetic, comparison, equality, boolean, ``&``, ``..`` and ``in``, each
compiled to a closure over its operands' closures."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from eventbus.jsonata._errors import fail
from eventbus.jsonata._values import UNDEFINED, Frame, Seq, deep_equal, to_boolean

__all__ = ["MAX_RANGE", "binary_fn", "string_of"]

Fn = Callable[[Any, Frame], Any]
#: the most items a range ``[a..b]`` may hold (jsonata-js's limit)
MAX_RANGE = 10_000_000
_NUM = (int, float)


def _is_num(v: Any) -> bool:
    cls = v.__class__
    return cls is int or cls is float


def _finite(v: Any, position: int) -> Any:
    if v.__class__ is float and (v - v) != 0.0:  # inf or nan
        raise fail("D1001", f"Number out of range: {v}", position, v)
    if v.__class__ is int and not -(2**63) < v < 2**63:
        return float(v)
    return v


def string_of(v: Any) -> str:
    """``$string`` of a defined value (for ``&``)."""
    from eventbus.jsonata._values import stringify

    if v.__class__ is str:
        return str(v)
    return stringify(v)


def _arith(op: str, lf: Fn, rf: Fn, pos: int) -> Fn:
    if op == "+":

        def calc(a: Any, b: Any) -> Any:
            return a + b
    elif op == "-":

        def calc(a: Any, b: Any) -> Any:
            return a - b
    elif op == "*":

        def calc(a: Any, b: Any) -> Any:
            return a * b
    elif op == "/":

        def calc(a: Any, b: Any) -> Any:
            if b == 0:
                return math.copysign(math.inf, a) * math.copysign(1, b) if a else math.nan
            return a / b
    else:

        def calc(a: Any, b: Any) -> Any:
            if b == 0:
                return math.nan
            if a.__class__ is int and b.__class__ is int:
                r = abs(a) % abs(b)
                return -r if a < 0 else r
            return math.fmod(a, b)

    def run(inp: Any, env: Frame) -> Any:
        a = lf(inp, env)
        b = rf(inp, env)
        ca, cb = a.__class__, b.__class__
        if (ca is int or ca is float) and (cb is int or cb is float):
            r = calc(a, b)
            if r.__class__ is float and (r - r) != 0.0 and op != "/":  # x/0 is +-Infinity
                return _finite(r, pos)
            if r.__class__ is int and not -(2**63) < r < 2**63:
                return float(r)
            return r
        if a is not UNDEFINED and not _is_num(a):
            msg = f"The left side of the {op!r} operator must evaluate to a number"
            raise fail("T2001", msg, pos, a)
        if b is not UNDEFINED and not _is_num(b):
            msg = f"The right side of the {op!r} operator must evaluate to a number"
            raise fail("T2002", msg, pos, b)
        if a is UNDEFINED or b is UNDEFINED:
            return UNDEFINED
        return _finite(calc(a, b), pos)  # pragma: no cover - numbers take the fast path

    return run


def _compare(op: str, lf: Fn, rf: Fn, pos: int) -> Fn:
    import operator

    cmp = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}[op]

    def run(inp: Any, env: Frame) -> Any:
        a = lf(inp, env)
        b = rf(inp, env)
        ca, cb = a.__class__, b.__class__
        a_ok = a is UNDEFINED or ca is str or ca is int or ca is float
        b_ok = b is UNDEFINED or cb is str or cb is int or cb is float
        if not a_ok or not b_ok:
            msg = f"The expressions either side of operator {op!r} must evaluate to numeric or string values"
            raise fail("T2010", msg, pos, a if not a_ok else b)
        if a is UNDEFINED or b is UNDEFINED:
            return UNDEFINED
        if (ca is str) != (cb is str):
            msg = f"The expressions either side of operator {op!r} must be of the same data type"
            raise fail("T2009", msg, pos, a)
        return cmp(a, b)

    return run


def binary_fn(op: str, lf: Fn, rf: Fn, pos: int) -> Fn:
    """The closure of ``lhs op rhs``."""
    if op in ("+", "-", "*", "/", "%"):
        return _arith(op, lf, rf, pos)
    if op in ("<", "<=", ">", ">="):
        return _compare(op, lf, rf, pos)
    if op in ("=", "!="):
        negate = op == "!="

        def eq(inp: Any, env: Frame) -> Any:
            a = lf(inp, env)
            b = rf(inp, env)
            ca = a.__class__
            if ca is b.__class__ and (ca is str or ca is int or ca is float):
                return (a == b) is not negate
            if a is UNDEFINED or b is UNDEFINED:
                return False
            return deep_equal(a, b) is not negate

        return eq
    if op == "and":

        def and_(inp: Any, env: Frame) -> Any:
            return to_boolean(lf(inp, env)) is True and to_boolean(rf(inp, env)) is True

        return and_
    if op == "or":

        def or_(inp: Any, env: Frame) -> Any:
            return to_boolean(lf(inp, env)) is True or to_boolean(rf(inp, env)) is True

        return or_
    if op == "&":

        def concat(inp: Any, env: Frame) -> Any:
            a = lf(inp, env)
            b = rf(inp, env)
            s = ("" if a is UNDEFINED else string_of(a)) + ("" if b is UNDEFINED else string_of(b))
            env.state.check_length(len(s), "A string")
            return s

        return concat
    if op == "..":
        return _range(lf, rf, pos)
    if op == "in":

        def in_(inp: Any, env: Frame) -> Any:
            a = lf(inp, env)
            b = rf(inp, env)
            if a is UNDEFINED or b is UNDEFINED:
                return False
            if not isinstance(b, list):
                b = [b]
            return any(deep_equal(a, x) and not isinstance(x, (list, dict)) for x in b)

        return in_
    raise fail("S0201", f"Unknown operator {op!r}", pos, op)  # pragma: no cover


def _range(lf: Fn, rf: Fn, pos: int) -> Fn:
    def run(inp: Any, env: Frame) -> Any:
        a = lf(inp, env)
        b = rf(inp, env)
        if a is not UNDEFINED and not (a.__class__ in _NUM and _is_num(a) and a == int(a)):
            raise fail(
                "T2003",
                "The left side of the range operator (..) must evaluate to an integer",
                pos,
                a,
            )
        if b is not UNDEFINED and not (b.__class__ in _NUM and _is_num(b) and b == int(b)):
            raise fail(
                "T2004",
                "The right side of the range operator (..) must evaluate to an integer",
                pos,
                b,
            )
        if a is UNDEFINED or b is UNDEFINED:
            return UNDEFINED
        a, b = int(a), int(b)
        if a > b:
            return UNDEFINED
        size = b - a + 1
        if size > MAX_RANGE:
            msg = f"The size of the sequence allocated by the range operator (..) must not exceed 1e7; got {size}"
            raise fail("D2014", msg, pos, size)
        env.state.check_length(size, "A range")
        env.state.charge(size)
        return Seq(range(a, b + 1))

    return run
