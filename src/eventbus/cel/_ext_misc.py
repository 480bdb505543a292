"""The CEL math, network (``ip``/``cidr``) and optionals extensions."""

from __future__ import annotations

import ipaddress
import math
from typing import Any, Final

from eventbus.cel._errors import EvalError
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


# -- network ------------------------------------------------------------------


def _parse_ip(text: Any, op: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if kind(text) != "string":
        no_overload(op, text)
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        msg = f"{op}: invalid IP address {text!r}"
        raise EvalError(msg) from None
    if isinstance(addr, ipaddress.IPv6Address) and (addr.ipv4_mapped or addr.scope_id):
        msg = f"{op}: IPv4-mapped and zoned IPv6 addresses are not allowed: {text!r}"
        raise EvalError(msg)
    return addr


def _parse_cidr(text: Any, op: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    if kind(text) != "string":
        no_overload(op, text)
    addr_text, _, prefix = str(text).partition("/")
    _parse_ip(addr_text, op)
    if not prefix.isdigit():
        msg = f"{op}: invalid CIDR {text!r}"
        raise EvalError(msg)
    try:
        return ipaddress.ip_interface(text)
    except ValueError:
        msg = f"{op}: invalid CIDR {text!r}"
        raise EvalError(msg) from None


def ip(text: Any) -> Any:
    """``ip(string)``."""
    return _parse_ip(text, "ip")


def cidr(text: Any) -> Any:
    """``cidr(string)``."""
    return _parse_cidr(text, "cidr")


def is_ip(text: Any) -> bool:
    """``isIP(string)``."""
    try:
        _parse_ip(text, "isIP")
    except EvalError:
        if kind(text) != "string":
            raise
        return False
    return True


def is_cidr(text: Any) -> bool:
    """``isCIDR(string)``."""
    try:
        _parse_cidr(text, "isCIDR")
    except EvalError:
        if kind(text) != "string":
            raise
        return False
    return True


def ip_is_canonical(text: object) -> bool:
    """``ip.isCanonical(string)``."""
    return str(_parse_ip(text, "ip.isCanonical")) == text


def _ip_method(name: str, fn: Any) -> Any:
    def impl(x: Any) -> Any:
        if kind(x) != "ip":
            no_overload(name, x)
        return fn(x)

    return impl


def _link_local_multicast(a: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if a.version == 4:
        return a in ipaddress.ip_network("224.0.0.0/24")
    return a.packed[0] == 0xFF and a.packed[1] & 0x0F == 0x02


def _global_unicast(a: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if a.version == 4 and a == ipaddress.IPv4Address("255.255.255.255"):
        return False
    return not (
        a.is_unspecified
        or a.is_loopback
        or a.is_multicast
        or a.is_link_local
        or (a.version == 6 and a in ipaddress.ip_network("fe80::/10"))
    )


def _cidr_method(name: str, fn: Any) -> Any:
    def impl(x: Any, *args: Any) -> Any:
        if kind(x) != "cidr":
            no_overload(name, x, *args)
        return fn(x, *args)

    return impl


def _contains_ip(c: Any, other: Any) -> bool:
    addr = other if kind(other) == "ip" else _parse_ip(other, "containsIP")
    return addr.version == c.version and addr in c.network


def _contains_cidr(c: Any, other: Any) -> bool:
    net = other if kind(other) == "cidr" else _parse_cidr(other, "containsCIDR")
    return bool(
        net.version == c.version
        and net.network.prefixlen >= c.network.prefixlen
        and net.network.network_address in c.network
    )


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
    ("ip", False): {1: ip},
    ("cidr", False): {1: cidr},
    ("isIP", False): {1: is_ip},
    ("isCIDR", False): {1: is_cidr},
    ("ip.isCanonical", False): {1: ip_is_canonical},
    ("family", True): {1: _ip_method("family", lambda a: a.version)},
    ("isUnspecified", True): {1: _ip_method("isUnspecified", lambda a: a.is_unspecified)},
    ("isLoopback", True): {1: _ip_method("isLoopback", lambda a: a.is_loopback)},
    ("isLinkLocalMulticast", True): {1: _ip_method("isLinkLocalMulticast", _link_local_multicast)},
    ("isLinkLocalUnicast", True): {
        1: _ip_method(
            "isLinkLocalUnicast",
            lambda a: (
                a in ipaddress.ip_network("169.254.0.0/16" if a.version == 4 else "fe80::/10")
            ),
        )
    },
    ("isGlobalUnicast", True): {1: _ip_method("isGlobalUnicast", _global_unicast)},
    ("containsIP", True): {2: _cidr_method("containsIP", _contains_ip)},
    ("containsCIDR", True): {2: _cidr_method("containsCIDR", _contains_cidr)},
    ("ip", True): {1: _cidr_method("ip", lambda c: c.ip)},
    ("masked", True): {1: _cidr_method("masked", lambda c: ipaddress.ip_interface(c.network))},
    ("prefixLength", True): {1: _cidr_method("prefixLength", lambda c: c.network.prefixlen)},
    ("optional.of", False): {1: opt_of},
    ("optional.none", False): {0: opt_none},
    ("optional.ofNonZeroValue", False): {1: opt_of_non_zero},
    ("hasValue", True): {1: opt_has_value},
    ("value", True): {1: opt_value},
    ("orValue", True): {2: opt_or_value},
    ("or", True): {2: opt_or},
}
