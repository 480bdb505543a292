"""CESQL AST to Python closures over a mapping of CloudEvent attributes (the fast path).

Every closure raises :class:`EvalError` on an error (fail fast); the common nodes
(attributes, literals, ``=`` against a literal, ``AND``/``OR``, ``LIKE``, ``IN``, ``NOT``)
get specialised closures, the others run :func:`apply` with strict casts. Both give the same
values (the TCK runs through both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventbus.cesql._apply import MISSING, STRICT, apply, missing
from eventbus.cesql._errors import EvalError
from eventbus.cesql._functions import GROWING
from eventbus.cesql._parser import Node
from eventbus.cesql._values import attribute_value, cast, to_bool, to_str, type_of

__all__ = ["Closure", "compile_node", "share_budget"]

Closure = Callable[[Any], Any]


def share_budget(root: Node, max_output_size: int) -> None:
    """Give each growing call (CONCAT, CONCAT_WS, LOWER, UPPER) an equal share of the
    expression's output budget: nodes run at most once per evaluation, so the total stays
    within ``max_output_size`` with no per-evaluation state."""
    calls: list[Node] = []
    stack = [root]
    while stack:
        n = stack.pop()
        if n.op == "call" and n.value in GROWING:
            calls.append(n)
        stack.extend(n.args)
    for n in calls:
        n.limit = max_output_size // len(calls)


def compile_node(node: Node) -> Closure:
    """The strict closure of ``node``."""
    op = node.op
    if op == "lit":
        value = node.value
        return lambda a: value
    if op == "attr":
        return _attr(node.value)
    if op == "exists":
        name = node.value
        return lambda a: name in a
    kids = tuple(compile_node(k) for k in node.args)
    if op == "not":
        (k,) = kids
        if node.args[0].type == "bool":
            return lambda a: not k(a)
        return lambda a: not to_bool(k(a))
    if op == "logic" and node.value in ("AND", "OR"):
        return _logic(node, kids)
    if op == "fold" and node.value in (("=",), ("!=",), ("<>",)) and node.args[1].op == "lit":
        return _equals_literal(node, kids[0])
    if op == "like":
        (k,) = kids
        match = node.value.match
        if node.negate:
            return lambda a: not match(to_str(k(a)))
        return lambda a: match(to_str(k(a)))
    if op == "in" and all(n.op == "lit" for n in node.args[1:]):
        return _in_literals(node, kids)
    return lambda a: apply(node, a, kids, STRICT)


def _attr(name: str) -> Closure:
    def attr(a: Any) -> Any:
        v = a.get(name, MISSING)
        if type(v) is str:
            return v
        if v is MISSING:
            raise missing(name)
        return attribute_value(v)

    return attr


def _logic(node: Node, kids: tuple[Closure, ...]) -> Closure:
    bools = all(n.type == "bool" for n in node.args)
    if not bools:
        kids = tuple(_as_bool(k) for k in kids)
    if len(kids) == 2:
        x, y = kids
        if node.value == "AND":
            return lambda a: x(a) and y(a)
        return lambda a: x(a) or y(a)
    if node.value == "AND":
        return lambda a: all(k(a) for k in kids)
    return lambda a: any(k(a) for k in kids)


def _as_bool(k: Closure) -> Closure:
    return lambda a: to_bool(k(a))


def _equals_literal(node: Node, left: Closure) -> Closure:
    lit = node.args[1].value
    target = type_of(lit)
    eq = node.value == ("=",)
    lt = node.args[0].type
    if target == "str" and lt in ("str", "any"):

        def str_eq(a: Any) -> bool:
            v = left(a)
            if type(v) is not str:
                v = to_str(v)
            return (v == lit) is eq

        return str_eq

    def eq_cast(a: Any) -> bool:
        return (cast(left(a), target) == lit) is eq

    return eq_cast


def _in_literals(node: Node, kids: tuple[Closure, ...]) -> Closure:
    left = kids[0]
    items = [n.value for n in node.args[1:]]
    negate = node.negate
    # per type of x, the items cast to it; None where one cannot be (the generic path
    # raises that cast error in order)
    by_type: dict[str, frozenset[Any] | None] = {}
    for t in ("str", "int", "bool"):
        try:
            by_type[t] = frozenset(cast(v, t) for v in items)
        except EvalError:
            by_type[t] = None

    def isin(a: Any) -> bool:
        x = left(a)
        found = by_type[type_of(x)]
        if found is None:
            return apply(node, a, (lambda _: x, *kids[1:]), STRICT)  # type: ignore[no-any-return]
        return (x in found) != negate

    return isin
