"""Event patterns compiled to one Python function each, as CEL expressions are: the checks of
scalar fields inline (exact values, numeric ranges, string operators by call), nested objects
inline down to :data:`MAX_INLINE_DEPTH` levels; arrays, objects where a scalar is expected,
deeper levels and ``$or`` alternatives call the :class:`Node`/:class:`Leaf` closures, which
hold the full semantics. No text from the pattern enters the source: every value is a
constant in the function's namespace, named ``K<n>``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventbus.pipelines.steps._pattern import ALIASES, Node
from eventbus.pipelines.steps._pattern_values import MISSING, Leaf, NumRange

__all__ = ["MAX_INLINE_DEPTH", "generate"]

#: Nested pattern objects inlined into the generated function; deeper ones are called.
MAX_INLINE_DEPTH = 8


class _Source:
    def __init__(self) -> None:
        self.lines: list[str] = []
        # builtins too: the function reads every name from a closure cell
        self.names: dict[str, Any] = {
            "M": MISSING,
            "L": list,
            "D": dict,
            "I": int,
            "F": float,
            "S": str,
            "K_EMPTY": {},
        }
        self._n = 0

    def const(self, value: Any) -> str:
        name = f"K{len(self.names)}"
        self.names[name] = value
        return name

    def var(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)


def generate(node: Node, *, event: bool) -> Callable[[Any], bool]:
    """The predicate for a whole pattern: over a CloudEvent (``event``) or a JSON document."""
    src = _Source()
    arg = "e" if event else "doc"
    if event:
        src.emit(1, "a = e.attributes")
        for key, sub in node.fields:
            key = ALIASES.get(key, key)
            getter = "e.data" if key == "data" else f"a.get({src.const(key)}, M)"
            _field(src, 1, getter, sub, 1)
        for group in node.ors:
            alts = [src.const(generate(alt, event=True)) for alt in group]
            src.emit(1, f"if not ({' or '.join(f'{a}(e)' for a in alts)}):")
            src.emit(2, "return False")
    else:
        src.emit(1, "d0 = doc if doc.__class__ is D else K_EMPTY")
        _object_body(src, 1, "d0", node, 1)
    src.emit(1, "return True")
    # every name the function reads is a closure cell (LOAD_DEREF), not a global
    params = ", ".join(src.names)
    lines = [f"def make({params}):", f"    def match({arg}):"]
    lines += ["    " + line for line in src.lines]
    lines.append("    return match")
    code = compile("\n".join(lines) + "\n", "<event pattern>", "exec")
    namespace: dict[str, Any] = {}
    exec(code, namespace)  # generated from constants only, see the docstring
    fn: Callable[[Any], bool] = namespace["make"](**src.names)
    return fn


def _object_body(src: _Source, indent: int, obj: str, node: Node, depth: int) -> None:
    for key, sub in node.fields:
        _field(src, indent, f"{obj}.get({src.const(key)}, M)", sub, depth)
    for group in node.ors:
        alts = [src.const(alt.match_object) for alt in group]
        src.emit(indent, f"if not ({' or '.join(f'{a}({obj})' for a in alts)}):")
        src.emit(indent + 1, "return False")


def _field(src: _Source, indent: int, getter: str, sub: Leaf | Node, depth: int) -> None:
    if isinstance(sub, Leaf):
        _leaf(src, indent, getter, sub)
        return
    if depth >= MAX_INLINE_DEPTH:
        src.emit(indent, f"if not {src.const(sub.match)}({getter}):")
        src.emit(indent + 1, "return False")
        return
    obj = src.var("d")
    src.emit(indent, f"{obj} = {getter}")
    src.emit(indent, f"if {obj}.__class__ is D:")
    _object_body(src, indent + 1, obj, sub, depth + 1)
    src.emit(indent, f"elif not {src.const(sub.match)}({obj}):")
    src.emit(indent + 1, "return False")


def _leaf(src: _Source, indent: int, getter: str, leaf: Leaf) -> None:
    v, t = src.var("v"), src.var("t")
    src.emit(indent, f"{v} = {getter}")
    expr = _scalar(src, v, t, leaf)
    if f"{t} " in expr:
        src.emit(indent, f"{t} = {v}.__class__")
    general = src.const(leaf.match)
    if leaf.any_preds or leaf.exists_true:
        # these hold for some non-scalars too: sort the shapes out first
        src.emit(indent, f"if {v}.__class__ is L or {v}.__class__ is D or {v} is M:")
        src.emit(indent + 1, f"if not {general}({v}):")
        src.emit(indent + 2, "return False")
        src.emit(indent, f"elif not ({expr}):")
        src.emit(indent + 1, "return False")
        return
    # the scalar checks are false on arrays, objects and MISSING: try them first, and the
    # general predicate (same answer on scalars) only when they fail
    src.emit(indent, f"if not ({expr}) and not {general}({v}):")
    src.emit(indent + 1, "return False")


def _scalar(src: _Source, v: str, t: str, leaf: Leaf) -> str:
    """The expression that holds when the scalar ``v`` (of class ``t``) matches."""
    if leaf.exists_true:
        return "True"
    parts: list[str] = []
    num = f"({t} is I or {t} is F)"
    if len(leaf.strs) == 1:
        parts.append(f"{v} == {src.const(next(iter(leaf.strs)))}")
    elif leaf.strs:
        parts.append(f"({t} is S and {v} in {src.const(leaf.strs)})")
    if leaf.nums:
        parts.append(f"({num} and {v} in {src.const(leaf.nums)})")
    for flag in leaf.flags:
        parts.append(f"{v} is {flag!r}")  # True, False or None: literals
    for r in leaf.ranges:
        parts.append(_range(src, v, num, r))
    if leaf.str_preds:
        calls = " or ".join(f"{src.const(p)}({v})" for p in leaf.str_preds)
        parts.append(f"({t} is S and ({calls}))")
    parts.extend(f"{src.const(p)}({v})" for p in leaf.any_preds)
    return " or ".join(parts) or "False"


def _range(src: _Source, v: str, num: str, r: NumRange) -> str:
    terms = [num]
    if r.lo is not None:
        terms.append(f"{v} {'>' if r.lo_open else '>='} {src.const(r.lo)}")
    if r.hi is not None:
        terms.append(f"{v} {'<' if r.hi_open else '<='} {src.const(r.hi)}")
    return f"({' and '.join(terms)})"
