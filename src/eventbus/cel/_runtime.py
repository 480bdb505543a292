"""CEL runtime core: value kinds, operators, equality, ordering (containers in ``_containers``).

These helpers implement the exact CEL semantics. The generated code inlines
cheap fast paths and calls these for everything else; every helper raises
``EvalError`` (or a plain Python exception that the program maps to
``CELError``) on a CEL evaluation error.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
from collections.abc import Mapping
from typing import Any, Final, NoReturn

from eventbus.cel._errors import EvalError
from eventbus.cel._values import EPOCH, CelType, Duration, Optional, Timestamp, UInt

__all__ = [
    "INT_MAX",
    "INT_MIN",
    "UINT_MAX",
    "dur_ns",
    "eq",
    "ge",
    "gt",
    "int_overflow",
    "key_matches",
    "kind",
    "le",
    "lt",
    "make_dur",
    "make_ts",
    "map_lookup",
    "ne",
    "no_overload",
    "ts_ns",
    "type_name",
    "uint_overflow",
]

INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**63 - 1
UINT_MAX: Final = 2**64 - 1
_NS_PER_US: Final = 1000
_US: Final = _dt.timedelta(microseconds=1)
# Timestamps: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999999Z, in ns since epoch.
TS_MIN_NS: Final = -62135596800 * 10**9
TS_MAX_NS: Final = 253402300799 * 10**9 + 999999999

_KINDS: Final[dict[type, str]] = {
    bool: "bool",
    int: "int",
    UInt: "uint",
    float: "double",
    str: "string",
    bytes: "bytes",
    type(None): "null",
    list: "list",
    tuple: "list",
    dict: "map",
    _dt.datetime: "timestamp",
    Timestamp: "timestamp",
    _dt.timedelta: "duration",
    Duration: "duration",
    CelType: "type",
    Optional: "optional",
    ipaddress.IPv4Address: "ip",
    ipaddress.IPv6Address: "ip",
    ipaddress.IPv4Interface: "cidr",
    ipaddress.IPv6Interface: "cidr",
}
_TYPE_NAMES: Final = {
    "bool": "bool",
    "int": "int",
    "uint": "uint",
    "double": "double",
    "string": "string",
    "bytes": "bytes",
    "null": "null_type",
    "list": "list",
    "map": "map",
    "timestamp": "google.protobuf.Timestamp",
    "duration": "google.protobuf.Duration",
    "type": "type",
    "optional": "optional_type",
    "ip": "net.IP",
    "cidr": "net.CIDR",
}


def kind(x: object) -> str:
    """The CEL kind of a Python value (``int``, ``uint``, ``map``, ``timestamp``...)."""
    k = _KINDS.get(type(x))
    if k is not None:
        return k
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, UInt):
        return "uint"
    if isinstance(x, int):
        return "int"
    if isinstance(x, float):
        return "double"
    if isinstance(x, str):
        return "string"
    if isinstance(x, (bytes, bytearray)):
        return "bytes"
    if isinstance(x, Mapping):
        return "map"
    if isinstance(x, (list, tuple)):
        return "list"
    if isinstance(x, _dt.datetime):
        return "timestamp"
    if isinstance(x, _dt.timedelta):
        return "duration"
    msg = f"unsupported value of Python type {type(x).__name__!r}"
    raise EvalError(msg)


def type_name(x: object) -> str:
    """The CEL type name of a value, for ``type()`` and error messages."""
    try:
        return _TYPE_NAMES[kind(x)]
    except EvalError:
        return type(x).__name__


def no_overload(op: str, *args: object) -> NoReturn:
    """Raise CEL's ``no matching overload`` error for ``op`` applied to ``args``."""
    types = ", ".join(type_name(a) for a in args)
    msg = f"no matching overload for '{op}' applied to ({types})"
    raise EvalError(msg)


def int_overflow(op: str) -> NoReturn:
    msg = f"int overflow in '{op}'"
    raise EvalError(msg)


def uint_overflow(op: str) -> NoReturn:
    msg = f"uint overflow in '{op}'"
    raise EvalError(msg)


def check_int(v: int, op: str) -> int:
    if INT_MIN <= v <= INT_MAX:
        return v
    int_overflow(op)


# -- timestamps and durations ------------------------------------------------


def ts_ns(x: _dt.datetime) -> int:
    """Nanoseconds since the Unix epoch of a timestamp (naive means UTC)."""
    if x.tzinfo is None:
        x = x.replace(tzinfo=_dt.UTC)
    return ((x - EPOCH) // _US) * _NS_PER_US + getattr(x, "nanos", 0)


def make_ts(ns: int) -> _dt.datetime:
    """Build a timestamp value from nanoseconds since the epoch (range-checked)."""
    if not TS_MIN_NS <= ns <= TS_MAX_NS:
        msg = "timestamp out of range"
        raise EvalError(msg)
    us, nanos = divmod(ns, _NS_PER_US)
    base = EPOCH + _dt.timedelta(microseconds=us)
    if not nanos:
        return base
    ts = Timestamp(
        base.year, base.month, base.day, base.hour, base.minute, base.second,
        base.microsecond, tzinfo=_dt.UTC,
    )  # fmt: skip
    ts.nanos = nanos
    return ts


def dur_ns(x: _dt.timedelta) -> int:
    """Nanoseconds of a duration."""
    return (x // _US) * _NS_PER_US + getattr(x, "nanos", 0)


def make_dur(ns: int) -> _dt.timedelta:
    """Build a duration value from nanoseconds (int64 range-checked, as cel-go)."""
    if not INT_MIN <= ns <= INT_MAX:
        msg = "duration out of range"
        raise EvalError(msg)
    us, nanos = divmod(ns, _NS_PER_US)
    if not nanos:
        return _dt.timedelta(microseconds=us)
    d = Duration(microseconds=us)
    d.nanos = nanos
    return d


# -- equality and ordering -------------------------------------------------------

_NUMERIC: Final = frozenset({"int", "uint", "double"})


def eq(a: Any, b: Any) -> bool:
    """CEL ``_==_`` with heterogeneous numeric equality; never raises for values."""
    ta = type(a)
    if ta is type(b) and (ta is str or ta is int or ta is float or ta is bytes or ta is bool):
        return bool(a == b)
    ka, kb = kind(a), kind(b)
    if ka != kb:
        if ka in _NUMERIC and kb in _NUMERIC:
            if ka == "double" or kb == "double":
                # as cel-go and cel-cpp: int and uint compare with doubles as doubles
                return float(a) == float(b)
            return bool(a == b)
        return False
    if ka == "list":
        if len(a) != len(b):
            return False
        return all(eq(x, y) for x, y in zip(a, b, strict=True))
    if ka == "map":
        if len(a) != len(b):
            return False
        for k, v in a.items():
            found, other = map_lookup(b, k)
            if not found or not eq(v, other):
                return False
        return True
    if ka == "timestamp":
        return ts_ns(a) == ts_ns(b)
    if ka == "duration":
        return dur_ns(a) == dur_ns(b)
    if ka == "optional":
        if a.has != b.has:
            return False
        return not a.has or eq(a.value, b.value)
    if ka == "cidr":
        return bool(a == b and a.network.prefixlen == b.network.prefixlen)
    return bool(a == b)


def ne(a: Any, b: Any) -> bool:
    """CEL ``_!=_``."""
    return not eq(a, b)


_ORDERED: Final = frozenset({"int", "uint", "double", "string", "bytes", "bool"})


def _cmp_operands(op: str, a: Any, b: Any) -> tuple[Any, Any]:
    ka, kb = kind(a), kind(b)
    if ka == kb:
        if ka in _ORDERED:
            return a, b
        if ka == "timestamp":
            return ts_ns(a), ts_ns(b)
        if ka == "duration":
            return dur_ns(a), dur_ns(b)
    elif ka in _NUMERIC and kb in _NUMERIC:
        if ka == "double" or kb == "double":
            return float(a), float(b)
        return a, b
    no_overload(op, a, b)


def lt(a: Any, b: Any) -> bool:
    """CEL ``_<_``."""
    x, y = _cmp_operands("_<_", a, b)
    return bool(x < y)


def le(a: Any, b: Any) -> bool:
    """CEL ``_<=_``."""
    x, y = _cmp_operands("_<=_", a, b)
    return bool(x <= y)


def gt(a: Any, b: Any) -> bool:
    """CEL ``_>_``."""
    x, y = _cmp_operands("_>_", a, b)
    return bool(x > y)


def ge(a: Any, b: Any) -> bool:
    """CEL ``_>=_``."""
    x, y = _cmp_operands("_>=_", a, b)
    return bool(x >= y)


# -- map keys (equality of maps needs them) -----------------------------------


def key_matches(stored: object, key: object) -> bool:
    # Python hashes True like 1; CEL keys true and 1 are distinct.
    return (type(stored) is bool) == (type(key) is bool)


def map_lookup(m: Mapping[Any, Any], key: Any) -> tuple[bool, Any]:
    """Find ``key`` in a CEL map: (found, value). Numeric keys compare across types."""
    tk = type(key)
    if tk is str:
        try:
            return True, m[key]
        except KeyError:
            return False, None
    k = kind(key)
    if k == "double":
        if key != key or key in (float("inf"), float("-inf")) or not key.is_integer():
            return False, None
        key = int(key)
        k = "int"
    elif k not in ("int", "uint", "bool"):
        if k != "string":
            no_overload("_[_]", m, key)
        key = str(key)
    try:
        value = m[key]
    except (KeyError, TypeError):
        return False, None
    if k == "bool" or key == 0 or key == 1:
        for stored in m:
            if stored == key and type(stored) is not float:
                return (key_matches(stored, key), value)
    return True, value
