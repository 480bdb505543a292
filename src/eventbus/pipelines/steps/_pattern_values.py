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

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from eventbus.pipelines.steps._pattern_strings import (
    Loc,
    PatternError,
    as_strings,
    as_text,
    cidr_condition,
    string_condition,
)

__all__ = ["MISSING", "OPERATORS", "Leaf", "NumRange", "PatternError", "compile_leaf"]

#: A field absent from the event.
MISSING: Any = object()

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


def _is_num(v: Any) -> bool:
    return type(v) in _NUM


def _number(v: Any, op: str, loc: Loc) -> float | int:
    if not _is_num(v) or (type(v) is float and not math.isfinite(v)):
        msg = f"numeric: the value after {op!r} must be a finite number; got {v!r} ({type(v).__name__})"
        raise PatternError(msg, loc, v)
    return v  # type: ignore[no-any-return]


def _numeric_pred(v: Any, loc: Loc) -> NumRange:
    """``["=", n]``, ``[">"|">=", n]``, ``["<"|"<=", n]`` or ``[">"|">=", lo, "<"|"<=", hi]``."""
    if not isinstance(v, list) or len(v) not in (2, 4):
        msg = (
            f"numeric takes [op, number] or [>|>=, low, <|<=, high]; got {v!r} "
            '(e.g. [">", 0, "<=", 5])'
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
    lo: float | int | None = None
    hi: float | int | None = None
    lo_open = hi_open = False
    for op, n in zip(ops, nums, strict=True):
        if op == "=":
            return NumRange(n, False, n, False)
        if op in (">", ">="):
            lo, lo_open = n, op == ">"
        else:
            hi, hi_open = n, op == "<"
    return NumRange(lo, lo_open, hi, hi_open)


@dataclass(frozen=True)
class NumRange:
    """A ``numeric`` condition: numbers (never booleans) within the bounds (None: open)."""

    lo: float | int | None
    lo_open: bool
    hi: float | int | None
    hi_open: bool

    def __call__(self, x: Any) -> bool:
        if type(x) not in _NUM:
            return False
        lo, hi = self.lo, self.hi
        if lo is not None and (x <= lo if self.lo_open else x < lo):
            return False
        return hi is None or (x < hi if self.hi_open else x <= hi)


def _anything_but(v: Any, loc: Loc) -> Pred:
    if isinstance(v, dict):
        if len(v) != 1 or next(iter(v)) not in _ANYTHING_BUT_FORMS:
            msg = (
                f"anything-but takes a value, a list, or one of {{prefix|suffix|"
                f"equals-ignore-case|wildcard: ...}}; got {v!r}"
            )
            raise PatternError(msg, loc, v)
        form, inner = next(iter(v.items()))
        texts = as_strings(inner, f"anything-but.{form}", (*loc, form))
        if form == "equals-ignore-case":
            lows = frozenset(t.lower() for t in texts)
            return lambda x: type(x) is not str or x.lower() not in lows
        if form in ("prefix", "suffix") and "" in texts:
            msg = f"anything-but.{form}: an empty {form} would exclude every string; remove it"
            raise PatternError(msg, (*loc, form), inner)
        preds = [string_condition(form, t, (*loc, form)) for t in texts]
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


def compile_leaf(conditions: list[Any], loc: Loc) -> Leaf:
    """One predicate over a field's value (``MISSING``, a scalar, an array or an object) for
    the list of conditions under that field."""
    if not conditions:
        msg = "an empty list matches nothing; give at least one value or condition"
        raise PatternError(msg, loc, conditions)
    strs: set[str] = set()
    nums: set[float | int] = set()
    flags: set[Any] = set()  # True, False, None
    str_preds: list[Callable[[str], bool]] = []
    num_preds: list[NumRange] = []
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
                str_preds.append(cidr_condition(arg, at))
            elif op == "exactly":
                strs.add(as_text(arg, op, at))
            else:
                str_preds.append(string_condition(op, arg, at))
        else:
            msg = (
                f"a condition must be a string, number, true, false, null or an operator "
                f"object; got {c!r} ({t.__name__})"
            )
            raise PatternError(msg, at, c)
    leaf = Leaf(
        frozenset(strs),
        frozenset(nums),
        frozenset(flags),
        tuple(str_preds),
        tuple(num_preds),
        tuple(any_preds),
        exists_true,
        exists_false,
    )
    return leaf


@dataclass(frozen=True)
class Leaf:
    """The conditions under one field, parsed; :attr:`match` is the predicate over the
    field's value (``MISSING``, a scalar, an array or an object), and the fields are what
    the code generator inlines."""

    strs: frozenset[str]
    nums: frozenset[float | int]
    flags: frozenset[Any]  # True, False, None
    str_preds: tuple[Callable[[str], bool], ...]
    ranges: tuple[NumRange, ...]
    any_preds: tuple[Pred, ...]  # anything-but: every type
    exists_true: bool
    exists_false: bool

    @cached_property
    def match(self) -> Pred:
        return _leaf(self)


def _leaf(spec: Leaf) -> Pred:
    strs_f, nums_f = spec.strs, spec.nums
    has_true, has_false, has_null = True in spec.flags, False in spec.flags, None in spec.flags
    s_preds, n_preds, a_preds = spec.str_preds, spec.ranges, spec.any_preds
    exists_true, exists_false = spec.exists_true, spec.exists_false

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
            for r in n_preds:
                if r(x):
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

    if not (s_preds or n_preds or a_preds or spec.flags or nums_f or exists_true or exists_false):
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
