"""The semantics of each CESQL node, one level at a time, in either error mode.

:func:`apply` evaluates one node given its children as closures. With :data:`STRICT`
casts every error raises (the fast path and every node below the root); with a
:class:`Recording` caster (the root, in complete evaluation) a failed implicit cast gives
the type's zero value and is recorded, and the node goes on, as the spec says (``NOT 10`` is
``true`` plus a cast error). An error raised below the root makes the root give its type's
zero value (the TCK: ``true AND (1 != 1 / 0)`` is ``false`` plus a math error).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from eventbus.cesql._errors import EvalError
from eventbus.cesql._functions import FUNCTIONS
from eventbus.cesql._parser import Node
from eventbus.cesql._values import (
    INT_MAX,
    INT_MIN,
    ZERO,
    attribute_value,
    cast,
    to_bool,
    type_of,
    wrap32,
)

__all__ = ["MISSING", "STRICT", "ChildFailed", "Recording", "apply", "arith", "missing"]

Kids = Sequence[Callable[[Any], Any]]
MISSING: Final = object()


class ChildFailed(Exception):
    """Internal: an error below the node being applied (the node gives its zero value)."""

    def __init__(self, error: EvalError) -> None:
        super().__init__(error)
        self.error = error


class _Strict:
    __slots__ = ()

    def __call__(self, v: Any, to: str) -> Any:
        return cast(v, to)


class Recording:
    """Casts that record their errors and give the zero value (complete evaluation)."""

    __slots__ = ("errors",)

    def __init__(self) -> None:
        self.errors: list[EvalError] = []

    def __call__(self, v: Any, to: str) -> Any:
        try:
            return cast(v, to)
        except EvalError as e:
            self.errors.append(e)
            return ZERO[to]


STRICT: Final = _Strict()


def missing(name: str) -> EvalError:
    """The error of reading an attribute the event lacks."""
    msg = f"the event has no attribute {name!r}; test it first with EXISTS {name} AND ..."
    return EvalError("missingAttribute", msg, False)


def arith(op: str, x: int, y: int) -> int:
    """``x op y`` on 32-bit integers: truncated division, math errors with their values."""
    if op == "+":
        r = x + y
    elif op == "-":
        r = x - y
    elif op == "*":
        r = x * y
    else:
        if y == 0:
            what = "division" if op == "/" else "modulo"
            raise EvalError("math", f"{what} by zero ({x} {op} 0); the result is 0", 0)
        q = abs(x) // abs(y)
        q = q if (x < 0) == (y < 0) else -q
        r = q if op == "/" else x - q * y
    if INT_MIN <= r <= INT_MAX:
        return r
    msg = f"{x} {op} {y} overflows a 32-bit integer"
    raise EvalError("math", msg, wrap32(r))


def _compare(op: str, x: Any, y: Any, casts: Callable[[Any, str], Any]) -> bool:
    if op in ("=", "!=", "<>"):
        # the right operand's type is the target type of the implicit cast
        eq = casts(x, type_of(y)) == y
        return eq if op == "=" else not eq
    x, y = casts(x, "int"), casts(y, "int")
    if op == "<":
        return x < y  # type: ignore[no-any-return]
    if op == "<=":
        return x <= y  # type: ignore[no-any-return]
    if op == ">":
        return x > y  # type: ignore[no-any-return]
    return x >= y  # type: ignore[no-any-return]


def _step(op: str, x: Any, y: Any, casts: Callable[[Any, str], Any]) -> Any:
    if op in ("+", "-", "*", "/", "%"):
        return arith(op, casts(x, "int"), casts(y, "int"))
    return _compare(op, x, y, casts)


def apply(node: Node, a: Any, kids: Kids, casts: Callable[[Any, str], Any]) -> Any:
    """The value of ``node`` on attributes ``a``, its children evaluated by ``kids``."""
    op = node.op
    if op == "lit":
        return node.value
    if op == "attr":
        v = a.get(node.value, MISSING)
        if v is MISSING:
            raise missing(node.value)
        return v if type(v) is str else attribute_value(v)
    if op == "exists":
        return node.value in a
    if op == "not":
        return not casts(kids[0](a), "bool")
    if op == "neg":
        return arith("-", 0, casts(kids[0](a), "int"))
    if op == "logic":
        return _logic(node.value, a, kids, casts)
    if op == "fold":
        ops = node.value
        acc = kids[0](a)
        last = len(ops) - 1
        for k, o in enumerate(ops):
            y = kids[k + 1](a)
            if k < last and casts is not STRICT:
                # an inner node of ((x op y) op z): its errors are a child's
                try:
                    acc = _step(o, acc, y, STRICT)
                except EvalError as e:
                    raise ChildFailed(e) from None
            else:
                acc = _step(o, acc, y, casts)
        return acc
    if op == "like":
        matched = node.value.match(casts(kids[0](a), "str"))
        return matched != node.negate
    if op == "in":
        x = kids[0](a)
        target = type_of(x)
        found = False
        for kid in kids[1:]:
            if casts(kid(a), target) == x:
                found = True
                break
        return found != node.negate
    assert op == "call"
    fn = FUNCTIONS[node.value]
    args = [casts(kid(a), fn.param(i)) for i, kid in enumerate(kids)]
    return fn.impl(args, node.limit)


def _logic(kind: str, a: Any, kids: Kids, casts: Callable[[Any, str], Any]) -> bool:
    # x o (y o (z ...)): the first operand's cast is this node's own, the others' belong to
    # the nested nodes (their errors are children's errors here)
    def operand(i: int) -> bool:
        v = kids[i](a)
        if i == 0 or n == 2 or casts is STRICT:
            return casts(v, "bool")  # type: ignore[no-any-return]
        try:
            return to_bool(v)
        except EvalError as e:
            raise ChildFailed(e) from None

    n = len(kids)
    if kind == "AND":
        return all(operand(i) for i in range(n))
    if kind == "OR":
        return any(operand(i) for i in range(n))
    acc = False
    for i in range(n):
        acc ^= operand(i)
    return acc
