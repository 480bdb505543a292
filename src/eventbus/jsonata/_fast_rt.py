"""Runtime helpers of the generated fast path (:mod:`eventbus.jsonata._fast`): the rare cases
of a path step, a predicate's verdict, a builtin called with JSONata's checks, the budget's
errors. Each reproduces what the closures of :mod:`eventbus.jsonata._compile` do."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from eventbus.jsonata._errors import JSONataError, fail
from eventbus.jsonata._ops import string_of
from eventbus.jsonata._paths import lookup, pick
from eventbus.jsonata._values import UNDEFINED, Cons, Frame, Seq, State, to_boolean

__all__ = [
    "Fallback",
    "by_index",
    "first",
    "negate",
    "second",
    "call_builtin",
    "flatten",
    "keep_count",
    "name_path",
    "name_step",
    "steps_spent",
    "string_part",
    "too_long",
]


class Fallback(Exception):
    """Raised by generated code for a case it leaves to the closures (evaluated again there)."""


def name_step(inp: Any, key: str) -> Any:
    """A name step over something other than an object, unwrapped as a step's value is."""
    r = lookup(inp, key)
    if r.__class__ is Seq:
        n = len(r)
        if n == 0:
            return UNDEFINED
        if n == 1:
            return r[0]
    return r


def name_path(inp: Any, keys: tuple[str, ...], budget: Any) -> Any:
    """A path of names that meets something other than objects: map, flatten, unwrap."""
    steps = budget.max_steps
    seq: Any = inp if isinstance(inp, list) else (inp,)
    last = len(keys) - 1
    for i, key in enumerate(keys):
        steps -= len(seq)
        if steps < 0:
            steps_spent()
        raw = []
        for item in seq:
            r = item.get(key, UNDEFINED) if item.__class__ is dict else name_step(item, key)
            if r is not UNDEFINED:
                raw.append(r)
        if not raw:
            return UNDEFINED
        if i == last and len(raw) == 1 and isinstance(raw[0], list) and raw[0].__class__ is not Seq:
            return raw[0]
        seq = flatten(raw)
        if not seq:
            return UNDEFINED
    return seq[0] if len(seq) == 1 else seq


def flatten(raw: list[Any]) -> Any:
    """The results of one path step as a sequence: arrays spliced in, constructed ones kept."""
    out = Seq()
    for r in raw:
        if isinstance(r, list) and r.__class__ is not Cons:
            out.extend(r)
        else:
            out.append(r)
    return out


def keep_count(res: Any, i: int, n: int) -> int:
    """How often item ``i`` of ``n`` passes a predicate whose value is not a boolean."""
    cls = res.__class__
    if cls is int or cls is float:
        res = [res]
    if (
        isinstance(res, list)
        and len(res) > 0
        and all((x.__class__ is int or x.__class__ is float) for x in res)
    ):
        count = 0
        for r in res:
            j = math.floor(r)
            if j < 0:
                j += n
            if j == i:
                count += 1
        return count
    return 1 if to_boolean(res) is True else 0


def by_index(inp: Any, index: int) -> Any:
    """A literal number predicate ``[n]``."""
    return pick(inp, index, Seq())


def call_builtin(impl: Callable[..., Any], validate: Callable[..., list[Any]], args: list[Any],
                 inp: Any, pos: int, budget: Any) -> Any:  # fmt: skip
    """A standard-library function with its signature's checks, as the closures call it."""
    b = budget
    env = Frame(None, State(b.max_steps, b.max_depth, b.max_length, b.max_time_ms))
    try:
        return impl(env, *validate(args, inp, pos))
    except JSONataError as exc:
        if not exc.position:
            exc.position = pos
        raise


def string_part(v: Any) -> str:
    """One side of ``&`` that is not a string."""
    return "" if v is UNDEFINED else string_of(v)


def too_long(n: int, limit: int) -> None:
    """The output budget's error for a string of ``n`` characters."""
    msg = f"A string of {n} items/characters exceeds the output budget (max_length {limit})"
    raise fail("U1003", msg, 0, n)


def steps_spent() -> None:
    """The step budget's error."""
    msg = "Expression evaluation exceeded its step budget (max_steps); check for an infinite loop"
    raise fail("U1001", msg)


def first(inp: Any, env: Any) -> Any:
    """The left operand, for an operator's closure called on ``(a, b)``."""
    return inp[0]


def second(inp: Any, env: Any) -> Any:
    """The right operand, for an operator's closure called on ``(a, b)``."""
    return inp[1]


def negate(position: int) -> Callable[[Any], Any]:
    """Unary minus of something other than a number (the closures' errors)."""

    def neg(v: Any) -> Any:
        if v is UNDEFINED:
            return UNDEFINED
        raise fail("D1002", "Cannot negate a non-numeric value", position, v)

    return neg
