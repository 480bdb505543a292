"""CEL standard functions: conversions, size, string tests, regex (time in ``_time``)."""

from __future__ import annotations

import datetime as _dt
import math
import re
from decimal import Decimal
from typing import Any, Final

from eventbus.cel._errors import EvalError, brief
from eventbus.cel._regex import compile_regex
from eventbus.cel._runtime import (
    INT_MAX,
    INT_MIN,
    UINT_MAX,
    dur_ns,
    kind,
    make_ts,
    no_overload,
    ts_ns,
    type_name,
)
from eventbus.cel._time import parse_duration, parse_timestamp
from eventbus.cel._values import CelType, UInt

__all__ = [
    "compile_regex",
    "format_double",
    "format_duration",
    "format_timestamp",
    "to_bool",
    "to_bytes",
    "to_double",
    "to_duration",
    "to_int",
    "to_string",
    "to_timestamp",
    "to_uint",
]

_INT_RE: Final = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE: Final = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
    re.IGNORECASE,
)
_BOOL_STRINGS: Final = {
    "1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
    "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False,
}  # fmt: skip
_TWO_POW_63: Final = 9223372036854775808.0
_TWO_POW_64: Final = 18446744073709551616.0


# -- conversions ---------------------------------------------------------------


def to_int(x: Any) -> int:
    """CEL ``int()``."""
    k = kind(x)
    if k == "int":
        return int(x)
    if k == "uint":
        if x > INT_MAX:
            raise EvalError("int overflow in int(uint)")
        return int(x)
    if k == "double":
        if math.isnan(x) or not -_TWO_POW_63 < x < _TWO_POW_63:
            raise EvalError("int overflow in int(double)")
        return int(x)
    if k == "string":
        if not _INT_RE.fullmatch(x):
            msg = f"cannot convert string {brief(x)} to int"
            raise EvalError(msg)
        # More than 20 digits is out of range whatever they are; Python's int() also
        # refuses strings of over 4,300 digits.
        v = int(x) if len(x.lstrip("+-0")) <= 20 else INT_MAX + 1
        if not INT_MIN <= v <= INT_MAX:
            raise EvalError("int overflow in int(string)")
        return v
    if k == "timestamp":
        return ts_ns(x) // 10**9
    no_overload("int", x)


def to_uint(x: Any) -> UInt:
    """CEL ``uint()``."""
    k = kind(x)
    if k == "uint":
        return x if type(x) is UInt else UInt(x)
    if k == "int":
        if x < 0:
            raise EvalError("uint overflow in uint(int)")
        return UInt(x)
    if k == "double":
        if math.isnan(x) or not 0.0 <= x < _TWO_POW_64:
            raise EvalError("uint overflow in uint(double)")
        return UInt(int(x))
    if k == "string":
        if not re.fullmatch(r"\+?[0-9]+", x):
            msg = f"cannot convert string {brief(x)} to uint"
            raise EvalError(msg)
        v = int(x) if len(x.lstrip("+0")) <= 20 else UINT_MAX + 1
        if v > UINT_MAX:
            raise EvalError("uint overflow in uint(string)")
        return UInt(v)
    no_overload("uint", x)


def to_double(x: Any) -> float:
    """CEL ``double()``."""
    k = kind(x)
    if k == "double":
        return float(x)
    if k in ("int", "uint"):
        return float(x)
    if k == "string":
        if not _FLOAT_RE.fullmatch(x):
            msg = f"cannot convert string {brief(x)} to double"
            raise EvalError(msg)
        return float(x)
    no_overload("double", x)


def format_double(x: float) -> str:
    """Format a double as cel-go/cel-cpp do (Go's ``%g`` with shortest digits)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x == 0.0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    sign, digit_tuple, exponent = Decimal(repr(x)).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    # position of the decimal point relative to the digit string
    point = len(digit_tuple) + exponent
    exp10 = point - 1
    prefix = "-" if sign else ""
    if exp10 < -4 or exp10 >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{prefix}{digits}{'0' * (point - len(digits))}"
    return f"{prefix}{digits[:point]}.{digits[point:]}"


def format_timestamp(x: _dt.datetime) -> str:
    """RFC 3339 in UTC, fraction trimmed, as ``2009-02-13T23:31:30.12Z``."""
    ns = ts_ns(x)
    secs, frac = divmod(ns, 10**9)
    base = _dt.datetime(1970, 1, 1) + _dt.timedelta(seconds=secs)
    text = base.strftime("%Y-%m-%dT%H:%M:%S")
    text = f"{base.year:04d}{text[text.index('-') :]}"
    return text + _fraction(frac) + "Z"


def _fraction(nanos: int) -> str:
    """The fractional seconds with trailing zeros trimmed (cel-go's format)."""
    if not nanos:
        return ""
    return "." + f"{nanos:09d}".rstrip("0")


def format_duration(x: _dt.timedelta) -> str:
    """Seconds with the fraction trimmed, as ``"1.5s"`` (cel-go's format)."""
    ns = dur_ns(x)
    secs, nanos = divmod(abs(ns), 10**9)
    return f"{'-' if ns < 0 else ''}{secs}{_fraction(nanos)}s"


def to_string(x: Any) -> str:
    """CEL ``string()``."""
    tx = type(x)
    if tx is str:
        return x  # type: ignore[no-any-return]
    if tx is int:
        return str(x)
    k = kind(x)
    if k in ("int", "uint"):
        return str(int(x))
    if k == "string":
        return str(x)
    if k == "double":
        return format_double(x)
    if k == "bool":
        return "true" if x else "false"
    if k == "bytes":
        try:
            return bytes(x).decode("utf-8")
        except UnicodeDecodeError:
            raise EvalError("invalid UTF-8 in bytes to string conversion") from None
    if k == "timestamp":
        return format_timestamp(x)
    if k == "duration":
        return format_duration(x)
    if k == "ip":
        return str(x)
    if k == "cidr":
        return f"{x.ip}/{x.network.prefixlen}"
    if k == "type":
        return str(x.name)
    no_overload("string", x)


def to_bytes(x: Any) -> bytes:
    """CEL ``bytes()``."""
    k = kind(x)
    if k == "bytes":
        return bytes(x)
    if k == "string":
        return str(x).encode("utf-8")
    no_overload("bytes", x)


def to_bool(x: Any) -> bool:
    """CEL ``bool()``."""
    k = kind(x)
    if k == "bool":
        return bool(x)
    if k == "string":
        try:
            return _BOOL_STRINGS[x]
        except KeyError:
            msg = f"cannot convert string {brief(x)} to bool"
            raise EvalError(msg) from None
    no_overload("bool", x)


def to_timestamp(x: Any) -> _dt.datetime:
    """CEL ``timestamp()``."""
    k = kind(x)
    if k == "timestamp":
        return x  # type: ignore[no-any-return]
    if k == "string":
        return parse_timestamp(x)
    if k == "int":
        return make_ts(int(x) * 10**9)
    no_overload("timestamp", x)


def to_duration(x: Any) -> _dt.timedelta:
    """CEL ``duration()``."""
    k = kind(x)
    if k == "duration":
        return x  # type: ignore[no-any-return]
    if k == "string":
        return parse_duration(x)
    no_overload("duration", x)


def type_of(x: Any) -> CelType:
    """CEL ``type()``."""
    return CelType(type_name(x))


def size(x: Any) -> int:
    """CEL ``size()`` of a string (code points), bytes, list or map."""
    k = kind(x)
    if k in ("string", "bytes", "list", "map"):
        return len(x)
    no_overload("size", x)


def _strings(op: str, a: Any, b: Any) -> tuple[str, str]:
    if type(a) is str and type(b) is str:
        return a, b
    if kind(a) == "string" and kind(b) == "string":
        return str(a), str(b)
    no_overload(op, a, b)


def contains(a: Any, b: Any) -> bool:
    """``string.contains(string)``."""
    s, t = _strings("contains", a, b)
    return t in s


def starts_with(a: Any, b: Any) -> bool:
    """``string.startsWith(string)``."""
    s, t = _strings("startsWith", a, b)
    return s.startswith(t)


def ends_with(a: Any, b: Any) -> bool:
    """``string.endsWith(string)``."""
    s, t = _strings("endsWith", a, b)
    return s.endswith(t)


def matches(a: Any, b: Any) -> bool:
    """``string.matches(regex)``: RE2 partial-match semantics."""
    s, p = _strings("matches", a, b)
    return compile_regex(p).search(s)


def dyn(x: Any) -> Any:
    """CEL ``dyn()``: the identity."""
    return x


__all__ += [
    "contains", "dyn", "ends_with", "matches", "size", "starts_with", "type_of",
]  # fmt: skip
