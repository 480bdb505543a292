"""The fast path's paths: steps mapped over sequences and flattened, predicates, and the
inline lookups of a path that meets only objects (a mixin of the generator in
:mod:`eventbus.jsonata._fast`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from eventbus.jsonata._parser import Node

__all__ = [
    "ATTRS",
    "CLEAN_RESULTS",
    "COMPARE",
    "FUNCTIONS",
    "MAX_INDENT",
    "MAX_NODES",
    "PathForms",
    "Unsupported",
]

#: the standard-library functions the fast path calls itself
FUNCTIONS = frozenset(["uppercase", "lowercase", "string", "number", "join", "length", "sum",
                       "count", "exists", "substring", "contains", "trim"])  # fmt: skip
#: attributes that put a node outside the subset
ATTRS = ("predicate", "group", "keepArray", "focus", "index", "tuple", "ancestor", "consarray",
          "seekingParent", "keepSingletonArray", "stages", "thunk")  # fmt: skip
_STR_RESULTS = frozenset(["uppercase", "lowercase", "string", "join", "substring", "trim"])
CLEAN_RESULTS = _STR_RESULTS | {"length", "count", "exists", "contains"}
COMPARE = frozenset(["<", "<=", ">", ">=", "=", "!="])
_BOOLISH = COMPARE | {"and", "or"}
MAX_INDENT = 40
MAX_NODES = 2000


class Unsupported(Exception):
    """The expression is outside the subset."""


class PathForms:
    """Mixin of the generator: compiles path nodes."""

    names: dict[str, Any]
    uses_steps: bool
    scalar_items: set[str]

    if TYPE_CHECKING:  # the generator's (mixed in beside); nothing defined here at run time

        def emit(self, ind: int, line: str) -> None: ...

        def tmp(self) -> str: ...

        def const(self, value: Any) -> str: ...

        def expr(self, node: Node, c: str, ind: int) -> tuple[str, bool]: ...

        def call(self, node: Node, c: str, ind: int) -> tuple[str, bool]: ...

    def path(self, node: Node, c: str, ind: int) -> str:
        steps = node.steps
        if any(node.get(a) for a in ("group", "keepSingletonArray", "tuple", "seekingParent",
                                     "predicate", "keepArray")):  # fmt: skip
            raise Unsupported("path")
        for i, s in enumerate(steps):
            if s.type not in ("name", "function", "block") or (i == 0 and s.type == "function"):
                raise Unsupported("step")
            if any(s.get(a) for a in ATTRS if a != "stages"):
                raise Unsupported("step")
            if any(st.type != "filter" for st in s.get("stages") or ()):
                raise Unsupported("stage")
        r = self.tmp()
        names = [s.value for s in steps if s.type == "name" and not s.get("stages")]
        if len(names) == len(steps):  # objects all the way inline, else the helper maps
            cond, v = self._chain(names, c)
            self.emit(ind, f"if {cond}: {r} = {v}")
            self.emit(ind, f"else: {r} = NP({c}, {self.const(tuple(names))}, budget)")
            return r
        prefix = 0
        while steps[prefix].type == "name" and not steps[prefix].get("stages"):
            prefix += 1
        self.emit(ind, "while True:")
        i1 = ind + 1
        seq = self.tmp()
        if prefix and prefix < len(steps) - 1:  # names over objects, then one step on one object
            cond, v = self._chain([s.value for s in steps[:prefix]], c)
            self.emit(i1, f"if {cond} and ({seq} := {v}).__class__ is D:")
            one = self._step(steps[prefix], seq, i1 + 1, is_object=True)
            self.emit(
                i1 + 1, f"if isinstance({one}, L) and {one}.__class__ is not C: {seq} = {one}"
            )
            self.emit(i1 + 1, f"elif {one} is U: {r} = U; break")
            self.emit(i1 + 1, f"else: {seq} = ({one},)")
            self.emit(i1 + 1, f"if not {seq}: {r} = U; break")
            self.emit(i1, "else:")
            self._steps(steps[: prefix + 1], c, seq, r, i1 + 1, False)
            prefix += 1
        elif prefix:  # leading names over objects: one object to go on from
            cond, v = self._chain([s.value for s in steps[:prefix]], c)
            self.emit(i1, f"if {cond} and ({seq} := {v}).__class__ is D: {seq} = ({seq},)")
            self.emit(i1, "else:")
            self._steps(steps[:prefix], c, seq, r, i1 + 1, False)
        else:
            self._steps([], c, seq, r, i1, False)
        self._steps(steps[prefix:], c, seq, r, i1, True)
        self.emit(i1, f"{r} = {seq}[0] if len({seq}) == 1 else {seq}")
        self.emit(i1, "break")
        last = steps[-1]
        if (last.type == "function" and not last.get("stages")
                and last.procedure.value in CLEAN_RESULTS):  # fmt: skip
            self.scalar_items.add(r)  # a scalar or a sequence of scalars
        return r

    def _steps(self, steps: list[Node], c: str, seq: str, r: str, i1: int, final: bool) -> None:
        """Map each step over ``seq`` (from ``c`` where no step went before), flattening."""
        if not final or not steps:
            self.emit(i1, f"{seq} = {c} if isinstance({c}, L) else ({c},)")
        for k, step in enumerate(steps):
            last = final and k == len(steps) - 1
            raw, it = self.tmp(), self.tmp()
            self.uses_steps = True
            self.emit(i1, f"N -= len({seq})")
            self.emit(i1, "if N < 0: SX()")
            # a step whose values are never arrays, or not the last: one sequence, spliced as
            # it is built; the last step's single array is the path's value as it is
            scalar = (step.type == "function" and not step.get("stages")
                      and step.procedure.value in CLEAN_RESULTS)  # fmt: skip
            self.emit(i1, f"{raw} = Q()" if scalar or not last else f"{raw} = []")
            self.emit(i1, f"for {it} in {seq}:")
            v = self._step(step, it, i1 + 1, last=last)
            if scalar or not last:
                if not scalar:
                    self.emit(i1 + 1, f"if isinstance({v}, L) and {v}.__class__ is not C: "
                                      f"{raw}.extend({v})")  # fmt: skip
                    self.emit(i1 + 1, f"elif {v} is not U: {raw}.append({v})")
                else:
                    self.emit(i1 + 1, f"if {v} is not U: {raw}.append({v})")
                self.emit(i1, f"{seq} = {raw}")
                self.emit(i1, f"if not {seq}: {r} = U; break")
                continue
            self.emit(i1 + 1, f"if {v} is not U: {raw}.append({v})")
            self.emit(i1, f"if not {raw}: {r} = U; break")
            self.emit(i1, f"if len({raw}) == 1 and isinstance({raw}[0], L) and "
                          f"{raw}[0].__class__ is not Q: {r} = {raw}[0]; break")  # fmt: skip
            self.emit(i1, f"{seq} = FL({raw})")
            self.emit(i1, f"if not {seq}: {r} = U; break")

    def _chain(self, keys: list[str], c: str) -> tuple[str, str]:
        """The condition that every key but the last meets an object, and the last lookup."""
        v = self.tmp()
        parts = ["DD" if c == "data" else f"{c}.__class__ is D"]  # DD: the input is an object
        src = c
        for key in keys[:-1]:
            parts.append(f"({v} := {src}.get({self.const(key)}, U)).__class__ is D")
            src = v
        return " and ".join(parts), f"{src}.get({self.const(keys[-1])}, U)"

    def _step(self, step: Node, it: str, ind: int, is_object: bool = False,
              last: bool = False) -> str:  # fmt: skip
        if step.type == "name":
            v = self.tmp()
            k = self.const(step.value)
            if is_object:
                self.emit(ind, f"{v} = {it}.get({k}, U)")
            else:
                self.emit(ind, f"{v} = {it}.get({k}, U) if {it}.__class__ is D else NM({it}, {k})")
        elif step.type == "function":
            v, _ = self.call(step, it, ind)
        else:
            v, _ = self.expr(step, it, ind)
        for st in step.get("stages") or ():
            pred = st.expr
            if pred.type == "number" and not any(pred.get(a) for a in ATTRS):
                self.emit(ind, f"{v} = BI({v}, {self.const(math.floor(pred.value))})")
                continue
            items, out, x, i, n = self.tmp(), self.tmp(), self.tmp(), self.tmp(), self.tmp()
            boolish = (pred.type == "binary" and pred.value in _BOOLISH) or (
                pred.type == "function" and pred.procedure.value in ("exists", "contains")
            )
            self.emit(ind, f"{items} = {v} if isinstance({v}, L) else [{v}]")
            self.emit(ind, f"{n} = len({items})")
            self.emit(ind, f"N -= {n}")
            self.emit(ind, "if N < 0: SX()")
            self.uses_steps = True
            # a sequence where the path ends (its single array is kept whole, a sequence not),
            # elsewhere its items are spliced into the next sequence: a list does
            self.emit(ind, f"{out} = Q()" if last else f"{out} = []")
            if boolish:  # True, False or undefined: kept on True only
                self.emit(ind, f"for {x} in {items}:")
                p, _ = self.expr(pred, x, ind + 1)
                self.emit(ind + 1, f"if {p} is True: {out}.append({x})")
            else:
                self.emit(ind, f"for {i}, {x} in enumerate({items}):")
                p, _ = self.expr(pred, x, ind + 1)
                self.emit(ind + 1, f"if {p} is True: {out}.append({x})")
                self.emit(
                    ind + 1, f"elif {p} is not False: {out}.extend([{x}] * KC({p}, {i}, {n}))"
                )
            self.emit(ind, f"{v} = {out}")
        return v
