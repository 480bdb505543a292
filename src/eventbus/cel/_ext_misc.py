"""The CEL math and optionals extensions, and the table of all extensions (network in
``_ext_network``)."""

from __future__ import annotations

import math
from typing import Any, Final

from eventbus.cel._errors import EvalError
from eventbus.cel._ext_network import FUNCTIONS as NETWORK_FUNCTIONS
from eventbus.cel._runtime import INT_MIN, UINT_MAX, eq, kind, no_overload
from eventbus.cel._values import NONE, Optional, UInt

__all__ = ["FUNCTIONS"]

_NUMERIC: Final = frozenset({"int", "uint", "double"})


# -- math ---------------------------------------------------------------------


def _extremum(op: str, args: tuple[Any, ...], greater: bool) -> Any:
    values: Any = args
    if len(args) == 1 and kind(args[0]) == "list":
        values = args[0]
        if not values:
            msg = f"{op}(): list argument must not be empty"
            raise EvalError(msg)
    best = None
    for v in values:
        if kind(v) not in _NUMERIC:
            no_overload(op, *args)
        if best is None or (v > best if greater else v < best):
            best = v
    return best


def greatest(*args: Any) -> Any:
    """``math.greatest(...)``: the largest numeric argument, keeping its type."""
    return _extremum("math.greatest", args, True)


def least(*args: Any) -> Any:
    """``math.least(...)``: the smallest numeric argument, keeping its type."""
    return _extremum("math.least", args, False)


def _double(op: str, x: Any) -> float:
    if kind(x) != "double":
        no_overload(op, x)
    return float(x)


def ceil(x: Any) -> float:
    """``math.ceil(double)``."""
    f = _double("math.ceil", x)
    return f if not math.isfinite(f) else math.copysign(float(math.ceil(f)), f)


def floor(x: Any) -> float:
    """``math.floor(double)``."""
    f = _double("math.floor", x)
    return f if not math.isfinite(f) else math.copysign(float(math.floor(f)), f)


def round_(x: Any) -> float:
    """``math.round(double)``: half away from zero."""
    f = _double("math.round", x)
    if not math.isfinite(f):
        return f
    a = abs(f)
    r = math.floor(a)
    if a - r >= 0.5:
        r += 1
    return math.copysign(float(r), f)


def trunc(x: Any) -> float:
    """``math.trunc(double)``."""
    f = _double("math.trunc", x)
    return f if not math.isfinite(f) else math.copysign(float(math.trunc(f)), f)


def abs_(x: Any) -> Any:
    """``math.abs(number)``."""
    k = kind(x)
    if k == "int":
        if x == INT_MIN:
            raise EvalError("int overflow in math.abs")
        return abs(int(x))
    if k in ("uint", "double"):
        return abs(x) if k == "double" else x
    no_overload("math.abs", x)


def sign(x: Any) -> Any:
    """``math.sign(number)``: -1, 0 or 1 of the argument's type."""
    k = kind(x)
    if k == "int":
        return (x > 0) - (x < 0)
    if k == "uint":
        return UInt(1 if x else 0)
    if k == "double":
        if math.isnan(x):
            return x
        return float((x > 0) - (x < 0))
    no_overload("math.sign", x)


def is_nan(x: Any) -> bool:
    """``math.isNaN(double)``."""
    return math.isnan(_double("math.isNaN", x))


def is_inf(x: Any) -> bool:
    """``math.isInf(double)``."""
    return math.isinf(_double("math.isInf", x))


def is_finite(x: Any) -> bool:
    """``math.isFinite(double)``."""
    return math.isfinite(_double("math.isFinite", x))


def sqrt(x: Any) -> float:
    """``math.sqrt(number)``: NaN for negative input."""
    if kind(x) not in _NUMERIC:
        no_overload("math.sqrt", x)
    f = float(x)
    return math.sqrt(f) if f >= 0 else float("nan")


def _to_signed(v: int) -> int:
    v &= UINT_MAX
    return v - (1 << 64) if v >= 1 << 63 else v


def _bitop(op: str, fn: Any) -> Any:
    def impl(a: Any, b: Any) -> Any:
        ka, kb = kind(a), kind(b)
        if ka == kb == "int":
            return _to_signed(fn(int(a), int(b)))
        if ka == kb == "uint":
            return UInt(fn(int(a), int(b)) & UINT_MAX)
        no_overload(op, a, b)

    return impl


bit_and = _bitop("math.bitAnd", lambda a, b: a & b)
bit_or = _bitop("math.bitOr", lambda a, b: a | b)
bit_xor = _bitop("math.bitXor", lambda a, b: a ^ b)


def bit_not(x: Any) -> Any:
    """``math.bitNot(int|uint)``."""
    k = kind(x)
    if k == "int":
        return ~int(x)
    if k == "uint":
        return UInt(~int(x) & UINT_MAX)
    no_overload("math.bitNot", x)


def _shift(op: str, x: Any, n: Any, left: bool) -> Any:
    k = kind(x)
    if k not in ("int", "uint") or kind(n) != "int":
        no_overload(op, x, n)
    if n < 0:
        msg = f"{op}(): negative shift count {n}"
        raise EvalError(msg)
    if n >= 64:
        return 0 if k == "int" else UInt(0)
    bits = int(x) & UINT_MAX
    r = (bits << n) & UINT_MAX if left else bits >> n
    return _to_signed(r) if k == "int" else UInt(r)


def bit_shift_left(x: Any, n: Any) -> Any:
    """``math.bitShiftLeft(x, n)``."""
    return _shift("math.bitShiftLeft", x, n, True)


def bit_shift_right(x: Any, n: Any) -> Any:
    """``math.bitShiftRight(x, n)``: logical shift (zero fill), also for int."""
    return _shift("math.bitShiftRight", x, n, False)


# -- optionals -----------------------------------------------------------------


def opt_of(x: Any) -> Optional:
    """``optional.of(x)``."""
    return Optional(x)


def opt_none() -> Optional:
    """``optional.none()``."""
    return NONE


def _zero(x: Any) -> bool:
    k = kind(x)
    if k in ("list", "map", "string", "bytes"):
        return len(x) == 0
    if k == "null":
        return True
    if k in ("int", "uint", "double", "bool"):
        return not x
    return False


def opt_of_non_zero(x: Any) -> Optional:
    """``optional.ofNonZeroValue(x)``."""
    return NONE if _zero(x) else Optional(x)


def _opt(op: str, x: Any, *rest: Any) -> Optional:
    if type(x) is not Optional:
        no_overload(op, x, *rest)
    return x


def opt_has_value(x: Any) -> bool:
    """``opt.hasValue()``."""
    return _opt("hasValue", x).has


def opt_value(x: Any) -> Any:
    """``opt.value()``: error when empty."""
    o = _opt("value", x)
    if not o.has:
        raise EvalError("optional.none() dereference")
    return o.value


def opt_or_value(x: Any, default: Any) -> Any:
    """``opt.orValue(default)``."""
    o = _opt("orValue", x, default)
    return o.value if o.has else default


def opt_or(x: Any, other: Any) -> Any:
    """``opt.or(other)``."""
    o = _opt("or", x, other)
    if o.has:
        return o
    return _opt("or", other)


_ = eq

# name -> {arity: implementation}; member functions count the receiver.
FUNCTIONS: Final[dict[tuple[str, bool], dict[int, Any]]] = {
    ("math.greatest", False): dict.fromkeys(range(1, 33), greatest),
    ("math.least", False): dict.fromkeys(range(1, 33), least),
    ("math.ceil", False): {1: ceil},
    ("math.floor", False): {1: floor},
    ("math.round", False): {1: round_},
    ("math.trunc", False): {1: trunc},
    ("math.abs", False): {1: abs_},
    ("math.sign", False): {1: sign},
    ("math.isNaN", False): {1: is_nan},
    ("math.isInf", False): {1: is_inf},
    ("math.isFinite", False): {1: is_finite},
    ("math.sqrt", False): {1: sqrt},
    ("math.bitAnd", False): {2: bit_and},
    ("math.bitOr", False): {2: bit_or},
    ("math.bitXor", False): {2: bit_xor},
    ("math.bitNot", False): {1: bit_not},
    ("math.bitShiftLeft", False): {2: bit_shift_left},
    ("math.bitShiftRight", False): {2: bit_shift_right},
    **NETWORK_FUNCTIONS,
    ("optional.of", False): {1: opt_of},
    ("optional.none", False): {0: opt_none},
    ("optional.ofNonZeroValue", False): {1: opt_of_non_zero},
    ("hasValue", True): {1: opt_has_value},
    ("value", True): {1: opt_value},
    ("orValue", True): {2: opt_or_value},
    ("or", True): {2: opt_or},
}
