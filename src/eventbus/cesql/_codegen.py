"""The fast path as generated Python: one function per expression, as CEL's is.

Attributes, literals, ``=``/``!=`` against literals, ``AND``/``OR``/``NOT``, ``LIKE`` and
``IN`` over literals become inline Python (a LIKE pattern without ``_`` becomes
``startswith``/``endswith``/``in``/``==``); other nodes call their closure from
:mod:`._compile`. The values and errors are those of the closures (the TCK runs through
both); where Python cannot compile the source (too deep), the closures are used instead.
"""

from __future__ import annotations

from typing import Any

from eventbus.cesql._apply import MISSING, missing
from eventbus.cesql._compile import Closure, compile_node
from eventbus.cesql._parser import Node
from eventbus.cesql._values import attribute_value, to_bool, to_str

__all__ = ["generate"]


def _attr_slow(v: Any, name: str) -> Any:
    if v is MISSING:
        raise missing(name)
    return attribute_value(v)


class _Gen:
    def __init__(self) -> None:
        self.names: dict[str, Any] = {
            "_M": MISSING,
            "_attr_slow": _attr_slow,
            "_to_str": to_str,
            "_to_bool": to_bool,
            "str": str,
        }
        self.n = 0

    def const(self, value: Any) -> str:
        self.n += 1
        name = f"_k{self.n}"
        self.names[name] = value
        return name

    def tmp(self) -> str:
        self.n += 1
        return f"_t{self.n}"

    def expr(self, node: Node) -> str:
        op = node.op
        if op == "lit":
            return repr(node.value)
        if op == "attr":
            t, key = self.tmp(), repr(node.value)
            return (
                f"({t} if ({t} := a.get({key}, _M)).__class__ is str else _attr_slow({t}, {key}))"
            )
        if op == "exists":
            return f"({node.value!r} in a)"
        if op == "not":
            return f"(not {self.boolean(node.args[0])})"
        if op == "logic" and node.value in ("AND", "OR"):
            joiner = f" {node.value.lower()} "
            return "(" + joiner.join(self.boolean(k) for k in node.args) + ")"
        if op == "fold" and len(node.value) == 1 and node.value[0] in ("=", "!=", "<>"):
            right = node.args[1]
            if right.op == "lit" and type(right.value) is str:
                eq = "==" if node.value[0] == "=" else "!="
                return f"({self.string(node.args[0])} {eq} {right.value!r})"
        if op == "like":
            return self.like(node)
        if op == "in" and all(k.op == "lit" for k in node.args[1:]):
            items = [k.value for k in node.args[1:]]
            if all(type(v) is str for v in items):
                t = self.tmp()
                left = self.expr(node.args[0])
                strs = self.const(frozenset(items))
                slow = self.const(compile_node(node))
                test = "not in" if node.negate else "in"
                return f"({t} {test} {strs} if ({t} := {left}).__class__ is str else {slow}(a))"
        return f"{self.const(compile_node(node))}(a)"

    def boolean(self, node: Node) -> str:
        code = self.expr(node)
        return code if node.type == "bool" else f"_to_bool({code})"

    def string(self, node: Node) -> str:
        code = self.expr(node)
        if node.type == "str":
            return code
        t = self.tmp()
        return f"({t} if ({t} := {code}).__class__ is str else _to_str({t}))"

    def like(self, node: Node) -> str:
        pattern = node.value
        pieces = pattern.pieces
        x = self.string(node.args[0])
        if all(type(p) is str for p, _ in pieces):
            texts = [p for p, _ in pieces]
            code = None
            if len(texts) == 1:
                code = f"({x} == {texts[0]!r})"
            elif len(texts) == 2 and texts[1] == "":
                code = f"{x}.startswith({texts[0]!r})"
            elif len(texts) == 2 and texts[0] == "":
                code = f"{x}.endswith({texts[1]!r})"
            elif len(texts) == 3 and texts[0] == texts[2] == "":
                code = f"({texts[1]!r} in {x})"
            if code is not None:
                return f"(not {code})" if node.negate else code
        match = self.const(pattern.match)
        return f"(not {match}({x}))" if node.negate else f"{match}({x})"


def generate(root: Node) -> Closure:
    """The fast-path function of ``root``."""
    gen = _Gen()
    try:
        body = gen.expr(root)
        code = compile(f"def _cesql(a):\n    return {body}\n", "<cesql>", "exec")
    except (RecursionError, SyntaxError, MemoryError):  # Python's own nesting limits
        return compile_node(root)
    namespace = dict(gen.names)
    exec(code, namespace)  # source built above from the parsed tree only
    return namespace["_cesql"]  # type: ignore[no-any-return]
