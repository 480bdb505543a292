"""Helpers of the compiler: the names an expression binds, the sequence unwrapping every
sequence-valued node gets, depth tracking, and the wildcard, descendant and name-chain steps."""

from __future__ import annotations

from typing import Any

from eventbus.jsonata._errors import fail
from eventbus.jsonata._parser import Node
from eventbus.jsonata._paths import Fn
from eventbus.jsonata._values import UNDEFINED, Frame, Seq

__all__ = ["bound_names", "descendants", "name_chain", "tracked", "unwrap", "wildcard"]


def bound_names(node: Any, out: set[str] | None = None) -> set[str]:
    """Every variable name the tree binds (``:=``, parameters, ``@``, ``#``)."""
    out = set() if out is None else out
    if isinstance(node, Node):
        t = node.type
        if t == "bind":
            out.add(node.lhs.value)
        elif t == "lambda":
            out.update(a.value for a in node.arguments)
        elif t == "index":
            out.add(node.value)
        for attr in ("focus", "index"):
            v = node.get(attr)
            if isinstance(v, str):
                out.add(v)
        for v in node.__dict__.values():
            if isinstance(v, (Node, list, tuple)):
                bound_names(v, out)
    elif isinstance(node, (list, tuple)):
        for v in node:
            bound_names(v, out)
    return out


def unwrap(fn: Fn, keep: bool) -> Fn:
    def run(inp: Any, env: Frame) -> Any:
        r = fn(inp, env)
        if r.__class__ is Seq and not r.tuple_stream:
            if keep:
                r.keep_singleton = True
            n = len(r)
            if n == 0:
                return UNDEFINED
            if n == 1 and not r.keep_singleton:
                return r[0]
        return r

    return run


def tracked(fn: Fn, position: int) -> Fn:
    def run(inp: Any, env: Frame) -> Any:
        state = env.state
        state.depth += 1
        if state.depth > state.max_depth:
            state.depth = 0
            msg = f"Stack overflow: evaluation nested deeper than {state.max_depth} (max_depth)"
            raise fail("U1001", msg, position)
        try:
            return fn(inp, env)
        finally:
            state.depth -= 1

    return run


def name_chain(keys: list[str], general: Fn) -> Fn:
    """``a.b.c`` over objects: plain lookups; any array on the way takes the general path."""
    last = len(keys) - 1

    def run(inp: Any, env: Frame) -> Any:
        v = inp
        for i, key in enumerate(keys):
            if v.__class__ is dict:
                v = v.get(key, UNDEFINED)
                if v is UNDEFINED:
                    return UNDEFINED
                if i < last and v.__class__ is not dict:
                    return general(inp, env)
            else:
                return general(inp, env)
        return v

    return run


def _flatten(v: Any, out: list[Any]) -> None:
    if isinstance(v, list):
        for x in v:
            _flatten(x, out)
    else:
        out.append(v)


def wildcard(inp: Any, env: Frame) -> Any:
    results = Seq()
    if inp.__class__ is Seq and inp.outer_wrapper and inp:
        inp = inp[0]
    if isinstance(inp, (dict, list)):  # an array's items, as JavaScript's Object.keys
        for v in inp.values() if isinstance(inp, dict) else inp:
            if isinstance(v, list):
                _flatten(v, results)
            else:
                results.append(v)
    return results


def descendants(inp: Any, env: Frame) -> Any:
    if inp is UNDEFINED:
        return UNDEFINED
    out = Seq()
    stack = [inp]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(reversed(v))
            continue
        out.append(v)
        if isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
    env.state.charge(len(out))
    if len(out) == 1:
        return out[0]
    return out
