"""The value conditions of EventBridge event patterns (the list under a field): exact values,
``prefix``, ``suffix``, ``equals-ignore-case``, ``wildcard``, ``anything-but``, ``numeric``,
``exists``, ``cidr`` and ``exactly``, compiled once into one predicate over the field's value.

Semantics follow ``aws/event-ruler``: a field matches when any condition matches any of its
values (an array in the event is its elements, nested arrays flattened); an object is no value
(``exists`` works on leaves only); strings, numbers, booleans and null never equal each other
(``300`` equals ``300.0``, never ``"300"`` or ``true``); string operators see strings only,
``numeric`` numbers only; ``anything-but`` matches every value its inner condition does not,
of any type. Wildcards match in linear time (one ``str.find`` per literal between ``*``s).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from typing import Any

__all__ = ["MISSING", "PatternError", "compile_leaf"]

#: A field absent from the event.
MISSING: Any = object()

Loc = tuple[int | str, ...]
Pred = Callable[[Any], bool]

OPERATORS = (
    "anything-but",
    "cidr",
    "equals-ignore-case",
    "exactly",
    "exists",
    "numeric",
    "prefix",
    "suffix",
    "wildcard",
)
_ANYTHING_BUT_FORMS = ("equals-ignore-case", "prefix", "suffix", "wildcard")
_NUM = (int, float)


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


def _is_num(v: Any) -> bool:
    return type(v) in _NUM


def _text(v: Any, what: str, loc: Loc) -> str:
    if type(v) is not str:
        msg = f"{what} takes a string; got {v!r} ({type(v).__name__})"
        raise PatternError(msg, loc, v)
    return v


def _strings(v: Any, what: str, loc: Loc) -> list[str]:
    """One string or a non-empty list of strings."""
    if isinstance(v, list):
        if not v:
            msg = f"{what} takes a string or a non-empty list of strings; got []"
            raise PatternError(msg, loc, v)
        return [_text(x, what, (*loc, i)) for i, x in enumerate(v)]
    return [_text(v, what, loc)]


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


def _cidr_pred(v: Any, loc: Loc) -> Pred:
    text = _text(v, "cidr", loc)
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


def _number(v: Any, op: str, loc: Loc) -> float | int:
    if not _is_num(v) or (type(v) is float and not math.isfinite(v)):
        msg = f"numeric: the value after {op!r} must be a finite number; got {v!r} ({type(v).__name__})"
        raise PatternError(msg, loc, v)
    return v  # type: ignore[no-any-return]


def _numeric_pred(v: Any, loc: Loc) -> Pred:
    """``["=", n]``, ``[">"|">=", n]``, ``["<"|"<=", n]`` or ``[">"|">=", lo, "<"|"<=", hi]``."""
    if not isinstance(v, list) or len(v) not in (2, 4):
        msg = (
            f"numeric takes [op, number] or [>|>=, low, <|<=, high]; got {v!r} "
            "(e.g. [\">\", 0, \"<=\", 5])"
        )
        raise PatternError(msg, loc, v)
    ops = v[0::2]
    for i, op in enumerate(ops):
        if op not in ("=", "<", "<=", ">", ">="):
            msg = f"numeric: unknown comparison {op!r}; use one of =, <, <=, >, >="
            raise PatternError(msg, (*loc, 2 * i), op)
    nums = [_number(v[2 * i + 1], op, (*loc, 2 * i + 1)) for i, op in enumerate(ops)]
    if len(ops) == 2 and (ops[0] not in (">", ">=") or ops[1] not in ("<", "<=")):
        msg = f"numeric range {v!r}: give the lower bound (> or >=) first, then the upper (< or <=)"
        raise PatternError(msg, loc, v)
    if len(ops) == 2 and not nums[0] < nums[1]:
        msg = f"numeric range {v!r}: the lower bound must be below the upper bound"
        raise PatternError(msg, loc, v)
    lo, lo_open, hi, hi_open = None, False, None, False
    for op, n in zip(ops, nums, strict=True):
        if op == "=":
            return lambda x: type(x) in _NUM and x == n
        if op in (">", ">="):
            lo, lo_open = n, op == ">"
        else:
            hi, hi_open = n, op == "<"

    def match(x: Any) -> bool:
        if type(x) not in _NUM:
            return False
        if lo is not None and (x <= lo if lo_open else x < lo):
            return False
        return hi is None or (x < hi if hi_open else x <= hi)

    return match


def _string_op(op: str, v: Any, loc: Loc) -> Callable[[str], bool]:
    """A positive string operator (prefix, suffix, equals-ignore-case, wildcard, exactly)."""
    if op in ("prefix", "suffix") and isinstance(v, dict):
        if list(v) != ["equals-ignore-case"]:
            msg = f"{op} takes a string or {{equals-ignore-case: string}}; got {v!r}"
            raise PatternError(msg, loc, v)
        p = _text(v["equals-ignore-case"], f"{op}.equals-ignore-case", (*loc, "equals-ignore-case"))
        low = p.lower()
        if op == "prefix":
            return lambda s: s.lower().startswith(low)
        return lambda s: s.lower().endswith(low)
    text = _text(v, op, loc)
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


def _anything_but(v: Any, loc: Loc) -> Pred:
    if isinstance(v, dict):
        if len(v) != 1 or next(iter(v)) not in _ANYTHING_BUT_FORMS:
            msg = (
                f"anything-but takes a value, a list, or one of {{prefix|suffix|"
                f"equals-ignore-case|wildcard: ...}}; got {v!r}"
            )
            raise PatternError(msg, loc, v)
        form, inner = next(iter(v.items()))
        texts = _strings(inner, f"anything-but.{form}", (*loc, form))
        if form == "equals-ignore-case":
            lows = frozenset(t.lower() for t in texts)
            return lambda x: type(x) is not str or x.lower() not in lows
        if form in ("prefix", "suffix") and "" in texts:
            msg = f"anything-but.{form}: an empty {form} would exclude every string; remove it"
            raise PatternError(msg, (*loc, form), inner)
        preds = [_string_op(form, t, (*loc, form)) for t in texts]
        return lambda x: type(x) is not str or not any(p(x) for p in preds)
    values = v if isinstance(v, list) else [v]
    if not values:
        msg = "anything-but takes a value or a non-empty list; got []"
        raise PatternError(msg, loc, v)
    for i, x in enumerate(values):
        if type(x) is not str and not _is_num(x):
            at = (*loc, i) if isinstance(v, list) else loc
            msg = f"anything-but values must be strings or numbers; got {x!r}"
            raise PatternError(msg, at, x)
    kinds = {type(x) is str for x in values}
    if len(kinds) > 1:
        msg = f"anything-but list {v!r} mixes strings and numbers; use all strings or all numbers"
        raise PatternError(msg, loc, v)
    if kinds == {True}:
        strs = frozenset(values)
        return lambda x: type(x) is not str or x not in strs
    nums = frozenset(values)
    return lambda x: type(x) not in _NUM or x not in nums


def _operator(cond: dict[str, Any], loc: Loc) -> tuple[str, Any]:
    if len(cond) != 1:
        keys = ", ".join(map(repr, cond)) or "none"
        msg = f"a condition object takes exactly one operator; got {keys} (split it into several list items)"
        raise PatternError(msg, loc, cond)
    op, arg = next(iter(cond.items()))
    if op not in OPERATORS:
        import difflib

        close = difflib.get_close_matches(str(op), OPERATORS, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        msg = f"unknown operator {op!r} ({hint}operators: {', '.join(OPERATORS)})"
        raise PatternError(msg, (*loc, str(op)), cond)
    return op, arg


def compile_leaf(conditions: list[Any], loc: Loc) -> Pred:
    """One predicate over a field's value (``MISSING``, a scalar, an array or an object) for
    the list of conditions under that field."""
    if not conditions:
        msg = "an empty list matches nothing; give at least one value or condition"
        raise PatternError(msg, loc, conditions)
    strs: set[str] = set()
    nums: set[float | int] = set()
    flags: set[Any] = set()  # True, False, None
    str_preds: list[Callable[[str], bool]] = []
    num_preds: list[Pred] = []
    any_preds: list[Pred] = []  # anything-but: every type
    exists_true = exists_false = False
    for i, c in enumerate(conditions):
        at = (*loc, i)
        t = type(c)
        if t is str:
            strs.add(c)
        elif t is bool or c is None:
            flags.add(c)
        elif t in _NUM:
            nums.add(c)
        elif t is dict:
            op, arg = _operator(c, at)
            at = (*at, op)
            if op == "exists":
                if type(arg) is not bool:
                    msg = f"exists takes true or false; got {arg!r}"
                    raise PatternError(msg, at, arg)
                exists_true |= arg
                exists_false |= not arg
            elif op == "numeric":
                num_preds.append(_numeric_pred(arg, at))
            elif op == "anything-but":
                any_preds.append(_anything_but(arg, at))
            elif op == "cidr":
                str_preds.append(_cidr_pred(arg, at))
            elif op == "exactly":
                strs.add(_text(arg, op, at))
            else:
                str_preds.append(_string_op(op, arg, at))
        else:
            msg = (
                f"a condition must be a string, number, true, false, null or an operator "
                f"object; got {c!r} ({t.__name__})"
            )
            raise PatternError(msg, at, c)
    return _leaf(strs, nums, flags, str_preds, num_preds, any_preds, exists_true, exists_false)


def _leaf(
    strs: set[str],
    nums: set[float | int],
    flags: set[Any],
    str_preds: list[Callable[[str], bool]],
    num_preds: list[Pred],
    any_preds: list[Pred],
    exists_true: bool,
    exists_false: bool,
) -> Pred:
    strs_f, nums_f = frozenset(strs), frozenset(nums)
    has_true, has_false, has_null = True in flags, False in flags, None in flags
    s_preds, n_preds, a_preds = tuple(str_preds), tuple(num_preds), tuple(any_preds)

    def one(x: Any) -> bool:
        t = type(x)
        if t is str:
            if x in strs_f:
                return True
            for p in s_preds:
                if p(x):
                    return True
        elif t is int or t is float:
            if x in nums_f:
                return True
            for p in n_preds:
                if p(x):
                    return True
        elif x is True:
            if has_true:
                return True
        elif x is False:
            if has_false:
                return True
        elif x is None and has_null:
            return True
        return any(p(x) for p in a_preds) if a_preds else False

    if not (s_preds or n_preds or a_preds or flags or nums_f or exists_true or exists_false):
        # only exact strings: the common case, kept short
        def leaf_strs(v: Any) -> bool:
            if type(v) is str:
                return v in strs_f
            if type(v) is list:
                return any(type(x) is str and x in strs_f for x in _flat(v))
            return False

        return leaf_strs

    def leaf(v: Any) -> bool:
        t = type(v)
        if t is list:
            values = _flat(v)
            if not values:
                return exists_false
            return exists_true or any(one(x) for x in values)
        if t is dict or v is MISSING:
            return exists_false
        return exists_true or one(v)

    return leaf


def _flat(v: list[Any]) -> list[Any]:
    """The scalar values of an event array (nested arrays flattened, objects left out),
    iteratively: an event's nesting depth cannot exhaust the stack."""
    if not any(type(x) is list or type(x) is dict for x in v):
        return v
    out: list[Any] = []
    stack = [iter(v)]
    while stack:
        for x in stack[-1]:
            if type(x) is list:
                stack.append(iter(x))
                break
            if type(x) is not dict:
                out.append(x)
        else:
            stack.pop()
    return out
