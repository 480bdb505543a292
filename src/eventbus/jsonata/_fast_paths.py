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
    flagged: set[str]
    top: Node | None
    uses_steps: bool
    scalar_items: set[str]

    if TYPE_CHECKING:  # the generator's (mixed in beside); nothing defined here at run time

        def emit(self, ind: int, line: str) -> None: ...

        def tmp(self) -> str: ...

        def const(self, value: Any) -> str: ...

        def lit(self, value: Any) -> str: ...

        def expr(self, node: Node, c: str, ind: int) -> tuple[str, bool]: ...

        def call(self, node: Node, c: str, ind: int) -> tuple[str, bool]: ...

        def test(self, node: Node, c: str, ind: int) -> str: ...

        def strict(self, node: Node, x: str) -> str | None: ...

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
        top = node is self.top
        names = [s.value for s in steps if s.type == "name" and not s.get("stages")]
        if len(names) == len(steps):  # objects all the way inline, else the helper maps
            self._lookup(names, c, r, ind)
            return r
        prefix = 0
        while steps[prefix].type == "name" and not steps[prefix].get("stages"):
            prefix += 1
        self.emit(ind, "while True:")
        i1 = ind + 1
        seq = self.tmp()
        if prefix and prefix < len(steps) - 1:  # names over objects, then one step on one object
            self._objects([s.value for s in steps[:prefix]], c, seq, i1)
            fuse = steps[-1] if prefix == len(steps) - 2 and self._fusable(steps) else None
            one = self._step(steps[prefix], seq, i1 + 1, is_object=True, then=fuse,
                             top=top)  # fmt: skip
            if fuse is not None:  # the step's filter applied the last step too: the values
                self.emit(i1 + 1, f"N -= len({one})")
                self.emit(i1 + 1, "if N < 0: SX()")
                self.emit(i1 + 1, f"{r} = U if not {one} else {one}[0] if len({one}) == 1 "
                                  f"else {one}")  # fmt: skip
                self.emit(i1 + 1, "break")
            else:
                self.emit(i1 + 1, f"if isinstance({one}, L) and {one}.__class__ is not C: "
                                  f"{seq} = {one}")  # fmt: skip
                self.emit(i1 + 1, f"elif {one} is U: {r} = U; break")
                self.emit(i1 + 1, f"else: {seq} = ({one},)")
                self.emit(i1 + 1, f"if not {seq}: {r} = U; break")
            self.emit(i1, "else:")
            self._steps(steps[: prefix + 1], c, seq, r, i1 + 1, False)
            prefix += 1
        elif prefix:  # leading names over objects: one object to go on from
            self._objects([s.value for s in steps[:prefix]], c, seq, i1)
            self.emit(i1 + 1, f"{seq} = ({seq},)")
            self.emit(i1, "else:")
            self._steps(steps[:prefix], c, seq, r, i1 + 1, False)
        else:
            self._steps([], c, seq, r, i1, False)
        self._steps(steps[prefix:], c, seq, r, i1, True, top)
        self.emit(i1, f"{r} = {seq}[0] if len({seq}) == 1 else {seq}")
        self.emit(i1, "break")
        last = steps[-1]
        if (last.type == "function" and not last.get("stages")
                and last.procedure.value in CLEAN_RESULTS):  # fmt: skip
            self.scalar_items.add(r)  # a scalar or a sequence of scalars
        return r

    def _fusable(self, steps: list[Node]) -> bool:
        """Whether the last step is a call on ``$`` with a form for strings, after a step
        whose last stage is a boolean filter: the filter's loop then applies it to the items
        it keeps."""
        stages = steps[-2].get("stages") or ()
        if not stages or steps[-1].get("stages") or steps[-1].type != "function":
            return False
        pred = stages[-1].expr
        return self.strict(steps[-1], "x") is not None and (
            (pred.type == "binary" and pred.value in _BOOLISH)
            or (pred.type == "function" and pred.procedure.value in ("exists", "contains"))
        )

    def _steps(self, steps: list[Node], c: str, seq: str, r: str, i1: int, final: bool,
               top: bool = False) -> None:  # fmt: skip
        """Map each step over ``seq`` (from ``c`` where no step went before), flattening."""
        if not final or not steps:
            self.emit(i1, f"{seq} = ({c},)" if c == "data" else
                          f"{seq} = {c} if isinstance({c}, L) else ({c},)")  # fmt: skip
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
            # the expression's value a list of scalars: returned as it is
            new = "[]" if (scalar and top) or not (scalar or last) else "Q()"
            self.emit(i1, f"{raw} = {new}")
            self.emit(i1, f"for {it} in {seq}:")
            fast = self.strict(step, it) if scalar else None
            if fast is not None:  # its form for a string first (a value, never undefined)
                self.emit(i1 + 1, f"if {it}.__class__ is S: {raw}.append({fast})")
                self.emit(i1 + 1, "else:")
                v = self._step(step, it, i1 + 2, last=last)
                self.emit(i1 + 2, f"if {v} is not U: {raw}.append({v})")
            else:
                v = self._step(step, it, i1 + 1, last=last)
                if scalar:
                    self.emit(i1 + 1, f"if {v} is not U: {raw}.append({v})")
                elif not last:
                    self.emit(i1 + 1, f"if isinstance({v}, L) and {v}.__class__ is not C: "
                                      f"{raw}.extend({v})")  # fmt: skip
                    self.emit(i1 + 1, f"elif {v} is not U: {raw}.append({v})")
            if scalar or not last:
                self.emit(i1, f"{seq} = {raw}")
                self.emit(i1, f"if not {seq}: {r} = U; break")
                continue
            self.emit(i1 + 1, f"if {v} is not U: {raw}.append({v})")
            self.emit(i1, f"if not {raw}: {r} = U; break")
            self.emit(i1, f"if len({raw}) == 1 and isinstance({raw}[0], L) and "
                          f"{raw}[0].__class__ is not Q: {r} = {raw}[0]; break")  # fmt: skip
            self.emit(i1, f"{seq} = FL({raw})")
            self.emit(i1, f"if not {seq}: {r} = U; break")

    def _chain(self, keys: list[str], c: str) -> str:
        """Subscripts of ``c`` by ``keys``, for inside ``try: ... except (KeyError,
        TypeError)``: ``c`` is an object (``data`` is, else the caller checks), and a value
        inside an object is read as JSON holds it: an array, a string, a number, true, false
        or null is not subscriptable by a string (TypeError), an object is a ``dict``."""
        return c + "".join(f"[{self.lit(key)}]" for key in keys)

    def _lookup(self, keys: list[str], c: str, r: str, ind: int) -> None:
        """``r`` = the path of names ``keys`` from ``c``: subscripts while it meets objects,
        else (an array, a missing key) the helper that maps and flattens."""
        helper = f"NP({c}, {self.const(tuple(keys))}, budget)"
        self.flagged.add(r)  # undefined only where UF is set
        self.emit(ind, "try:")
        if c == "data":
            self.emit(ind + 1, f"{r} = {self._chain(keys, c)}")
        else:
            self.emit(ind + 1, f"if {c}.__class__ is D: {r} = {self._chain(keys, c)}")
            self.emit(ind + 1, f"else: {r} = {helper}; UF = True")
        if len(keys) == 1 and c == "data":
            self.emit(ind, f"except KeyError: {r} = U; UF = True")
        else:
            self.emit(ind, f"except (KeyError, TypeError): {r} = {helper}; UF = True")

    def _objects(self, keys: list[str], c: str, target: str, ind: int) -> None:
        """Opens ``if`` the names ``keys`` from ``c`` meet objects only (the last in ``target``)."""
        ok = self.tmp()
        cond = "" if c == "data" else f"{c}.__class__ is D and "
        self.emit(ind, f"try: {ok} = {cond}({target} := {self._chain(keys, c)}).__class__ is D")
        self.emit(ind, f"except (KeyError, TypeError): {ok} = False")
        self.emit(ind, f"if {ok}:")

    def _step(self, step: Node, it: str, ind: int, is_object: bool = False,
              last: bool = False, then: Node | None = None, top: bool = False) -> str:  # fmt: skip
        if step.type == "name":
            v = self.tmp()
            k = self.lit(step.value)
            if is_object:
                self.emit(ind, f"try: {v} = {it}[{k}]")
                self.emit(ind, f"except KeyError: {v} = U")
            else:
                self.emit(ind, f"{v} = {it}.get({k}, U) if {it}.__class__ is D else NM({it}, {k})")
        elif step.type == "function":
            v, _ = self.call(step, it, ind)
        else:
            v, _ = self.expr(step, it, ind)
        stages = step.get("stages") or ()
        for j, st in enumerate(stages):
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
            fuse = then if j == len(stages) - 1 else None
            # a sequence where the path ends (its single array is kept whole, a sequence not),
            # elsewhere its items are spliced into the next sequence: a list does
            self.emit(ind, f"{out} = Q()" if last or (fuse and not top) else f"{out} = []")
            if boolish:  # True, False or undefined: kept on True only
                self.emit(ind, f"for {x} in {items}:")
                p = self.test(pred, x, ind + 1)
                if fuse is not None:  # the next (and last) step on a kept string, else closures
                    self.emit(ind + 1, f"if {p}:")
                    self.emit(
                        ind + 2, f"if {x}.__class__ is S: {out}.append({self.strict(fuse, x)})"
                    )
                    self.emit(ind + 2, "else: raise FB")
                else:
                    self.emit(ind + 1, f"if {p}: {out}.append({x})")
            else:
                self.emit(ind, f"for {i}, {x} in enumerate({items}):")
                p, _ = self.expr(pred, x, ind + 1)
                self.emit(ind + 1, f"if {p} is True: {out}.append({x})")
                self.emit(
                    ind + 1, f"elif {p} is not False: {out}.extend([{x}] * KC({p}, {i}, {n}))"
                )
            self.emit(ind, f"{v} = {out}")
        return v
