"""CEL arithmetic and boolean operators (exact semantics, with overflow checks)."""

from __future__ import annotations

import math
from typing import Any

from eventbus.cel._errors import EvalError
from eventbus.cel._runtime import (
    INT_MAX,
    INT_MIN,
    UINT_MAX,
    check_int,
    dur_ns,
    int_overflow,
    kind,
    make_dur,
    make_ts,
    no_overload,
    ts_ns,
    uint_overflow,
)
from eventbus.cel._values import UInt

__all__ = ["add", "check_bool", "div", "mod", "mul", "neg", "not_", "sub"]


# -- arithmetic ----------------------------------------------------------------


def add(a: Any, b: Any) -> Any:
    """CEL ``_+_``."""
    ta = type(a)
    if ta is type(b):
        if ta is int:
            r = a + b
            if INT_MIN <= r <= INT_MAX:
                return r
            int_overflow("_+_")
        if ta is float or ta is str or ta is bytes or ta is list:
            return a + b
    ka, kb = kind(a), kind(b)
    if ka == kb:
        if ka == "int":
            return check_int(int(a) + int(b), "_+_")
        if ka == "uint":
            r = int(a) + int(b)
            if r > UINT_MAX:
                uint_overflow("_+_")
            return UInt(r)
        if ka in ("double", "string", "bytes"):
            return a + b
        if ka == "list":
            return [*a, *b]
        if ka == "duration":
            return make_dur(dur_ns(a) + dur_ns(b))
    elif ka == "timestamp" and kb == "duration":
        return make_ts(ts_ns(a) + dur_ns(b))
    elif ka == "duration" and kb == "timestamp":
        return make_ts(ts_ns(b) + dur_ns(a))
    no_overload("_+_", a, b)


def sub(a: Any, b: Any) -> Any:
    """CEL ``_-_``."""
    ta = type(a)
    if ta is type(b):
        if ta is int:
            r = a - b
            if INT_MIN <= r <= INT_MAX:
                return r
            int_overflow("_-_")
        if ta is float:
            return a - b
    ka, kb = kind(a), kind(b)
    if ka == kb:
        if ka == "int":
            return check_int(int(a) - int(b), "_-_")
        if ka == "uint":
            r = int(a) - int(b)
            if r < 0:
                uint_overflow("_-_")
            return UInt(r)
        if ka == "double":
            return a - b
        if ka == "duration":
            return make_dur(dur_ns(a) - dur_ns(b))
        if ka == "timestamp":
            return make_dur(ts_ns(a) - ts_ns(b))
    elif ka == "timestamp" and kb == "duration":
        return make_ts(ts_ns(a) - dur_ns(b))
    no_overload("_-_", a, b)


def mul(a: Any, b: Any) -> Any:
    """CEL ``_*_``."""
    ta = type(a)
    if ta is type(b):
        if ta is int:
            r = a * b
            if INT_MIN <= r <= INT_MAX:
                return r
            int_overflow("_*_")
        if ta is float:
            return a * b
    ka, kb = kind(a), kind(b)
    if ka == kb:
        if ka == "int":
            return check_int(int(a) * int(b), "_*_")
        if ka == "uint":
            r = int(a) * int(b)
            if r > UINT_MAX:
                uint_overflow("_*_")
            return UInt(r)
        if ka == "double":
            return a * b
    no_overload("_*_", a, b)


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def div(a: Any, b: Any) -> Any:
    """CEL ``_/_`` (integer division truncates toward zero)."""
    ka, kb = kind(a), kind(b)
    if ka == kb:
        if ka == "int":
            if b == 0:
                raise EvalError("division by zero")
            if a == INT_MIN and b == -1:
                int_overflow("_/_")
            return _trunc_div(int(a), int(b))
        if ka == "uint":
            if b == 0:
                raise EvalError("division by zero")
            return UInt(int(a) // int(b))
        if ka == "double":
            if b == 0.0:
                if a != a or a == 0.0:
                    return float("nan")
                neg = (a < 0) != (math.copysign(1.0, b) < 0)
                return float("-inf") if neg else float("inf")
            return a / b
    no_overload("_/_", a, b)


def mod(a: Any, b: Any) -> Any:
    """CEL ``_%_`` (the remainder takes the dividend's sign)."""
    ka, kb = kind(a), kind(b)
    if ka == kb:
        if ka == "int":
            if b == 0:
                raise EvalError("modulus by zero")
            if a == INT_MIN and b == -1:
                int_overflow("_%_")
            r = abs(int(a)) % abs(int(b))
            return -r if a < 0 else r
        if ka == "uint":
            if b == 0:
                raise EvalError("modulus by zero")
            return UInt(int(a) % int(b))
    no_overload("_%_", a, b)


def neg(a: Any) -> Any:
    """CEL unary ``-_``."""
    k = kind(a)
    if k == "int":
        if a == INT_MIN:
            int_overflow("-_")
        return -int(a)
    if k == "double":
        return -a
    if k == "duration":
        return make_dur(-dur_ns(a))
    no_overload("-_", a)


def not_(a: Any) -> bool:
    """CEL ``!_``."""
    if a is True:
        return False
    if a is False:
        return True
    no_overload("!_", a)


def check_bool(a: Any, op: str = "_&&_") -> bool:
    """Return ``a`` if it is a bool, else raise no matching overload."""
    if a is True or a is False:
        return a
    no_overload(op, a)
