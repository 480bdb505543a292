"""The string conditions of EventBridge event patterns (``prefix``, ``suffix``,
``equals-ignore-case``, ``wildcard``, ``cidr``, ``exactly``), each a predicate on strings,
and :class:`PatternError`, which every malformed part of a pattern raises.

Wildcards match in linear time: one ``str.find`` per literal between ``*``s, each placed
leftmost, never backtracking.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

__all__ = [
    "Loc",
    "PatternError",
    "as_strings",
    "as_text",
    "cidr_condition",
    "string_condition",
    "wildcard_pred",
]

Loc = tuple[int | str, ...]


class PatternError(ValueError):
    """A malformed event pattern: ``loc`` is the path inside the pattern, ``value`` the
    offending value; the message names the fix."""

    def __init__(self, message: str, loc: Loc = (), value: Any = None) -> None:
        super().__init__(message, loc, value)
        self.message = message
        self.loc = loc
        self.value = value

    def __str__(self) -> str:
        where = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in self.loc)
        return f"pattern{where}: {self.message}"


def as_text(v: Any, what: str, loc: Loc) -> str:
    if type(v) is not str:
        msg = f"{what} takes a string; got {v!r} ({type(v).__name__})"
        raise PatternError(msg, loc, v)
    return v


def as_strings(v: Any, what: str, loc: Loc) -> list[str]:
    """One string or a non-empty list of strings."""
    if isinstance(v, list):
        if not v:
            msg = f"{what} takes a string or a non-empty list of strings; got []"
            raise PatternError(msg, loc, v)
        return [as_text(x, what, (*loc, i)) for i, x in enumerate(v)]
    return [as_text(v, what, loc)]


def parse_wildcard(text: str, loc: Loc) -> list[str]:
    """The literal segments between the unescaped ``*``s of a wildcard (``\\*`` is a star,
    ``\\\\`` a backslash; any other escape, and ``**``, are errors, as in event-ruler)."""
    segments: list[str] = []
    current: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 < n and text[i + 1] in "*\\":
                current.append(text[i + 1])
                i += 2
                continue
            msg = (
                f"wildcard {text!r}: invalid escape at position {i}; only \\* (a star) and "
                "\\\\ (a backslash) may be escaped"
            )
            raise PatternError(msg, loc, text)
        if c == "*":
            if i + 1 < n and text[i + 1] == "*":
                msg = (
                    f"wildcard {text!r}: consecutive wildcard characters at position {i}; "
                    "one * already matches any run of characters"
                )
                raise PatternError(msg, loc, text)
            segments.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    segments.append("".join(current))
    return segments


def wildcard_pred(text: str, loc: Loc) -> Callable[[str], bool]:
    """A predicate on strings for a wildcard: linear time, no backtracking."""
    segs = parse_wildcard(text, loc)
    if len(segs) == 1:
        only = segs[0]
        return lambda s: s == only
    first, last, middle = segs[0], segs[-1], tuple(s for s in segs[1:-1] if s)
    least = sum(map(len, segs))
    start0, tail = len(first), len(last)

    def match(s: str) -> bool:
        if len(s) < least or not s.startswith(first) or not s.endswith(last):
            return False
        pos, end = start0, len(s) - tail
        for seg in middle:  # leftmost placement of each literal is optimal for '*' globs
            i = s.find(seg, pos, end)
            if i < 0:
                return False
            pos = i + len(seg)
        return True

    return match


def cidr_condition(v: Any, loc: Loc) -> Callable[[str], bool]:
    text = as_text(v, "cidr", loc)
    if "/" not in text:
        msg = f"cidr {text!r} needs a prefix length, e.g. '10.0.0.0/24' (or '{text}/32' for one address)"
        raise PatternError(msg, loc, v)
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        msg = f"cidr {text!r} is not an IPv4 or IPv6 network ({exc}); write e.g. '10.0.0.0/24'"
        raise PatternError(msg, loc, v) from None

    def match(s: str) -> bool:
        try:
            return ipaddress.ip_address(s) in net
        except ValueError:
            return False

    return match


def string_condition(op: str, v: Any, loc: Loc) -> Callable[[str], bool]:
    """A positive string operator (prefix, suffix, equals-ignore-case, wildcard, exactly)."""
    if op in ("prefix", "suffix") and isinstance(v, dict):
        if list(v) != ["equals-ignore-case"]:
            msg = f"{op} takes a string or {{equals-ignore-case: string}}; got {v!r}"
            raise PatternError(msg, loc, v)
        p = as_text(
            v["equals-ignore-case"], f"{op}.equals-ignore-case", (*loc, "equals-ignore-case")
        )
        low = p.lower()
        if op == "prefix":
            return lambda s: s.lower().startswith(low)
        return lambda s: s.lower().endswith(low)
    text = as_text(v, op, loc)
    if op == "prefix":
        return lambda s: s.startswith(text)
    if op == "suffix":
        return lambda s: s.endswith(text)
    if op == "equals-ignore-case":
        low = text.lower()
        return lambda s: s.lower() == low
    if op == "wildcard":
        return wildcard_pred(text, loc)
    return lambda s: s == text  # exactly
