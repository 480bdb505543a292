"""The CEL network extension: ``ip``, ``cidr``, ``isIP``, ``isCIDR`` and their methods."""

from __future__ import annotations

import ipaddress
from typing import Any, Final

from eventbus.cel._errors import EvalError
from eventbus.cel._runtime import kind, no_overload

__all__ = ["FUNCTIONS"]


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


# name -> {arity: implementation}; member functions count the receiver.
FUNCTIONS: Final[dict[tuple[str, bool], dict[int, Any]]] = {
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
}
