"""The fast path: an expression of a common subset compiled to the source of one Python
function (``compile()`` once), which replaces :meth:`Expression.evaluate` for that expression.

The subset: paths of names (mapping over arrays and flattening, as every path does),
predicates ``[...]`` on their steps, function-call steps (``.$uppercase($)``), ``$``, literals,
``+ - * / %``, comparisons, ``=``/``!=``, ``and``/``or``, ``&``, unary minus, array and object
constructors (literal, distinct keys), and calls of :data:`FUNCTIONS`. Anything else (and
bindings passed to ``evaluate``, or an array as the input) runs the closures instead. A case
the generated code does not handle inline calls the same helpers the closures use, or raises
:class:`~eventbus.jsonata._fast_rt.Fallback` to evaluate the closures once more, so the results
and error codes are the closures'. No text from the expression enters the source: every
literal is a constant of the function's namespace, named ``K<n>``.

Budgets: the subset has no loops but the mapping over the input's arrays, so each mapping
charges ``max_steps`` for its items (a bound on the time too); ``&`` and ``$join`` check
``max_length``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from eventbus.jsonata import _fast_rt as rt
from eventbus.jsonata._errors import JSONataError
from eventbus.jsonata._ops import binary_fn
from eventbus.jsonata._parser import Node
from eventbus.jsonata._values import UNDEFINED, Builtin, Cons, Seq, to_boolean

__all__ = ["FUNCTIONS", "generate"]

#: the standard-library functions the fast path calls itself
FUNCTIONS = frozenset(["uppercase", "lowercase", "string", "number", "join", "length", "sum",
                       "count", "exists", "substring", "contains", "trim"])  # fmt: skip
#: attributes that put a node outside the subset
_ATTRS = ("predicate", "group", "keepArray", "focus", "index", "tuple", "ancestor", "consarray",
          "seekingParent", "keepSingletonArray", "stages", "thunk")  # fmt: skip
_STR_RESULTS = frozenset(["uppercase", "lowercase", "string", "join", "substring", "trim"])
_CLEAN_RESULTS = _STR_RESULTS | {"length", "count", "exists", "contains"}
_COMPARE = frozenset(["<", "<=", ">", ">=", "=", "!="])
_BOOLISH = _COMPARE | {"and", "or"}
_MAX_INDENT = 40
_MAX_NODES = 2000


class Unsupported(Exception):  # noqa: N818 - a signal, not an error
    """The expression is outside the subset."""


def _first(inp: Any, env: Any) -> Any:
    return inp[0]


def _second(inp: Any, env: Any) -> Any:
    return inp[1]


class _Gen:
    def __init__(self, builtins: dict[str, Any]) -> None:
        self.builtins = builtins
        self.lines: list[str] = []
        self.names: dict[str, Any] = {
            "U": UNDEFINED, "D": dict, "L": list, "S": str, "I": int, "F": float, "Q": Seq,
            "C": Cons, "NM": rt.name_step, "FL": rt.flatten, "KC": rt.keep_count,
            "BI": rt.by_index, "CB": rt.call_builtin, "SP": rt.string_part, "TL": rt.too_long,
            "SX": rt.steps_spent, "FB": rt.Fallback, "TB": to_boolean, "NP": rt.name_path,
        }  # fmt: skip
        self.n = 0
        self.nodes = 0
        self.uses_steps = False
        self.uses_length = False

    def const(self, value: Any) -> str:
        name = f"K{len(self.names)}"
        self.names[name] = value
        return name

    def tmp(self) -> str:
        self.n += 1
        return f"t{self.n}"

    def emit(self, ind: int, line: str) -> None:
        if ind > _MAX_INDENT:
            raise Unsupported("nested too deeply")
        self.lines.append("    " * ind + line)

    # -- expressions: each emits statements and returns (a name holding the value, clean) where
    # clean means plain JSON by construction (no sequence, nothing non-finite)

    def expr(self, node: Node, c: str, ind: int) -> tuple[str, bool]:
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise Unsupported("too large")
        t = node.type
        if t != "path" and any(node.get(a) for a in _ATTRS):
            raise Unsupported(t)
        if t in ("string", "value"):
            return self.const(node.value), True
        if t == "number":
            v = node.value
            ok = v.__class__ is int or (v.__class__ is float and math.isfinite(v))
            return self.const(v), ok
        if t == "variable" and node.value == "":
            return c, False
        if t == "path":
            return self.path(node, c, ind), False
        if t == "binary":
            return self.binary(node, c, ind)
        if t == "unary":
            return self.unary(node, c, ind)
        if t == "function":
            return self.call(node, c, ind)
        if t == "block":  # ( ... ): no bindings in the subset, so no frame of its own
            r, clean = "U", True
            for e in node.expressions:
                r, clean = self.expr(e, c, ind)
            return r, clean
        raise Unsupported(t)

    def binary(self, node: Node, c: str, ind: int) -> tuple[str, bool]:
        op = node.value
        r = self.tmp()
        if op in ("and", "or"):
            a, _ = self.expr(node.lhs, c, ind)
            test = f"{a} is True or ({a} is not False and TB({a}) is True)"
            self.emit(ind, f"if {test}:" if op == "and" else f"if not ({test}):")
            b, _ = self.expr(node.rhs, c, ind + 1)
            self.emit(ind + 1, f"{r} = {b} is True or ({b} is not False and TB({b}) is True)")
            self.emit(ind, f"else: {r} = {op == 'or'}")
            return r, True
        if op not in _COMPARE and op not in ("+", "-", "*", "/", "%", "&"):
            raise Unsupported(op)
        a, _ = self.expr(node.lhs, c, ind)
        b, _ = self.expr(node.rhs, c, ind)
        if op == "&":
            self.emit(ind, f"{r} = ({a} if {a}.__class__ is S else SP({a})) + "
                           f"({b} if {b}.__class__ is S else SP({b}))")  # fmt: skip
            self.emit(ind, f"if len({r}) > ML: TL(len({r}), ML)")
            self.uses_length = True
            return r, True
        slow = self.const(binary_fn(op, _first, _second, node.position))
        num_a = f"({a}.__class__ is I or {a}.__class__ is F)"
        num_b = f"({b}.__class__ is I or {b}.__class__ is F)"
        if op in ("+", "-", "*"):
            if node.rhs.type == "number":  # a literal number (the check below sees inf)
                self.emit(ind, f"if {num_a}:")
            else:
                self.emit(ind, f"if {num_a} and {num_b}:")
            self.emit(ind + 1, f"{r} = {a} {op} {b}")
            self.emit(ind + 1, f"if {r} - {r} != 0.0 or ({r}.__class__ is I and "
                               f"not -9223372036854775808 < {r} < 9223372036854775808):")  # fmt: skip
            self.emit(ind + 2, f"{r} = {slow}(({a}, {b}), None)")
            self.emit(ind, f"else: {r} = {slow}(({a}, {b}), None)")
            return r, True
        if op in ("/", "%"):
            self.emit(ind, f"{r} = {slow}(({a}, {b}), None)")
            return r, False
        kinds = {str: "S", int: "I", float: "F"}
        if b in self.names and self.names[b].__class__ in kinds:  # a literal: its type known
            same = f"{a}.__class__ is {kinds[self.names[b].__class__]}"
        elif a in self.names and self.names[a].__class__ in kinds:
            same = f"{b}.__class__ is {kinds[self.names[a].__class__]}"
        else:
            same = f"{a}.__class__ is {b}.__class__ and ({a}.__class__ is S or "
            same += f"{a}.__class__ is I or {a}.__class__ is F)"
        pyop = "==" if op == "=" else op
        self.emit(ind, f"{r} = {a} {pyop} {b} if {same} else {slow}(({a}, {b}), None)")
        return r, True

    def unary(self, node: Node, c: str, ind: int) -> tuple[str, bool]:
        r = self.tmp()
        if node.value == "-":
            a, _ = self.expr(node.expression, c, ind)
            neg = self.const(_neg(node.position))
            self.emit(ind, f"{r} = -{a} if {a}.__class__ is I or {a}.__class__ is F else {neg}({a})")
            return r, True
        if node.value == "[":
            self.emit(ind, f"{r} = []")
            clean = True
            for item in node.expressions:
                v, ok = self.expr(item, c, ind)
                if item.type == "unary" and item.value == "[":
                    self.emit(ind, f"if {v} is not U: {r}.append({v})")
                    clean = clean and ok
                else:
                    self.emit(ind, f"if isinstance({v}, L): {r}.extend({v})")
                    self.emit(ind, f"elif {v} is not U: {r}.append({v})")
                    clean = clean and ok and item.type != "path" and item.type != "variable"
            return r, clean
        # an object constructor with literal, distinct keys; over an array it groups: the closures
        keys = [k.value for k, _ in node.lhs if k.type == "string" and not k.get("predicate")]
        if len(keys) != len(node.lhs) or len(set(keys)) != len(keys):
            raise Unsupported("computed keys")
        self.emit(ind, f"if isinstance({c}, L): raise FB")
        self.emit(ind, f"{r} = {{}}")
        for key, (_, value) in zip(keys, node.lhs, strict=True):
            v, ok = self.expr(value, c, ind)
            k = self.const(key)
            if ok:
                self.emit(ind, f"if {v} is not U: {r}[{k}] = {v}")
            else:
                self.emit(ind, f"if {v} is not U: {r}[{k}] = {v} if {v}.__class__ is S or "
                               f"{v}.__class__ is I else PV({v})")  # fmt: skip
        return r, True

    def call(self, node: Node, c: str, ind: int) -> tuple[str, bool]:
        proc = node.procedure
        if proc.type != "variable" or any(proc.get(a) for a in _ATTRS):
            raise Unsupported("call")
        name = proc.value
        builtin = self.builtins.get(name)
        if name not in FUNCTIONS or builtin.__class__ is not Builtin:
            raise Unsupported(f"${name}")
        args = [self.expr(a, c, ind)[0] for a in node.arguments]
        r = self.tmp()
        slow = (f"CB({self.const(builtin.impl)}, {self.const(builtin.signature.validate)}, "
                f"[{', '.join(args)}], {c}, {node.position}, budget)")  # fmt: skip
        if name in ("uppercase", "lowercase") and len(args) == 1:
            method = "upper" if name == "uppercase" else "lower"
            self.emit(ind, f"{r} = {args[0]}.{method}() if {args[0]}.__class__ is S else {slow}")
        elif name in ("string", "length") and len(args) == 1:
            fast = args[0] if name == "string" else f"len({args[0]})"
            self.emit(ind, f"{r} = {fast} if {args[0]}.__class__ is S else {slow}")
        elif name == "join" and len(args) == 2:
            a, sep = args
            self.emit(ind, f"if {a}.__class__ is L and {sep}.__class__ is S:")
            self.emit(ind + 1, "try:")
            self.emit(ind + 2, f"{r} = {sep}.join({a})")
            self.emit(ind + 2, f"if len({r}) > ML: TL(len({r}), ML)")
            self.uses_length = True
            self.emit(ind + 1, f"except TypeError: {r} = {slow}")
            self.emit(ind, f"else: {r} = {slow}")
        else:
            self.emit(ind, f"{r} = {slow}")
        return r, name in _CLEAN_RESULTS

    # -- paths

    def path(self, node: Node, c: str, ind: int) -> str:
        steps = node.steps
        if any(node.get(a) for a in ("group", "keepSingletonArray", "tuple", "seekingParent",
                                     "predicate", "keepArray")):  # fmt: skip
            raise Unsupported("path")
        for i, s in enumerate(steps):
            if s.type not in ("name", "function", "block") or (i == 0 and s.type == "function"):
                raise Unsupported("step")
            if any(s.get(a) for a in _ATTRS if a != "stages"):
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
        if prefix:  # leading names over objects: one object to go on from
            cond, v = self._chain([s.value for s in steps[:prefix]], c)
            self.emit(i1, f"if {cond} and {v}.__class__ is D: {seq} = ({v},)")
            self.emit(i1, "else:")
            self._steps(steps[:prefix], c, seq, r, i1 + 1, False)
        else:
            self._steps([], c, seq, r, i1, False)
        self._steps(steps[prefix:], c, seq, r, i1, True)
        self.emit(i1, f"{r} = {seq}[0] if len({seq}) == 1 else {seq}")
        self.emit(i1, "break")
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
                      and step.procedure.value in _CLEAN_RESULTS)  # fmt: skip
            self.emit(i1, f"{raw} = Q()" if scalar or not last else f"{raw} = []")
            self.emit(i1, f"for {it} in {seq}:")
            v = self._step(step, it, i1 + 1)
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
        """The condition that every key but the last meets an object, and the last value."""
        v = self.tmp()
        parts = [f"{c}.__class__ is D"]
        src = c
        for key in keys[:-1]:
            parts.append(f"({v} := {src}.get({self.const(key)}, U)).__class__ is D")
            src = v
        parts.append(f"({v} := {src}.get({self.const(keys[-1])}, U)) is not FB")
        return " and ".join(parts), v

    def _step(self, step: Node, it: str, ind: int) -> str:
        if step.type == "name":
            v = self.tmp()
            k = self.const(step.value)
            self.emit(ind, f"{v} = {it}.get({k}, U) if {it}.__class__ is D else NM({it}, {k})")
        elif step.type == "function":
            v, _ = self.call(step, it, ind)
        else:
            v, _ = self.expr(step, it, ind)
        for st in step.get("stages") or ():
            pred = st.expr
            if pred.type == "number" and not any(pred.get(a) for a in _ATTRS):
                self.emit(ind, f"{v} = BI({v}, {self.const(math.floor(pred.value))})")
                continue
            items, out, x, i, n = self.tmp(), self.tmp(), self.tmp(), self.tmp(), self.tmp()
            boolish = (pred.type == "binary" and pred.value in _BOOLISH) or (
                pred.type == "function" and pred.procedure.value in ("exists", "contains"))
            self.emit(ind, f"{items} = {v} if isinstance({v}, L) else [{v}]")
            self.emit(ind, f"{n} = len({items})")
            self.emit(ind, f"N -= {n}")
            self.emit(ind, "if N < 0: SX()")
            self.uses_steps = True
            self.emit(ind, f"{out} = Q()")
            if boolish:  # True, False or undefined: kept on True only
                self.emit(ind, f"for {x} in {items}:")
                p, _ = self.expr(pred, x, ind + 1)
                self.emit(ind + 1, f"if {p} is True: {out}.append({x})")
            else:
                self.emit(ind, f"for {i}, {x} in enumerate({items}):")
                p, _ = self.expr(pred, x, ind + 1)
                self.emit(ind + 1, f"if {p} is True: {out}.append({x})")
                self.emit(ind + 1, f"elif {p} is not False: {out}.extend([{x}] * KC({p}, {i}, {n}))")
            self.emit(ind, f"{v} = {out}")
        return v


def _neg(position: int) -> Callable[[Any], Any]:
    from eventbus.jsonata._errors import fail

    def neg(v: Any) -> Any:
        if v is UNDEFINED:
            return UNDEFINED
        raise fail("D1002", "Cannot negate a non-numeric value", position, v)

    return neg


_ERRORS = (TypeError, AttributeError, KeyError, IndexError, ValueError, ArithmeticError,
           RecursionError, rt.Fallback)  # fmt: skip


def generate(tree: Node, builtins: dict[str, Any], slow: Callable[..., Any],
             plain: Callable[[Any], Any], default_budget: Any) -> Callable[..., Any] | None:  # fmt: skip
    """The generated ``evaluate(data, bindings=None, budget=...)``, or None outside the subset."""
    gen = _Gen(builtins)
    try:
        r, clean = gen.expr(tree, "data", 2)
    except Unsupported:
        return None

    def clean_value(v: Any) -> Any:
        try:
            return plain(v)
        except JSONataError:
            raise rt.Fallback from None  # the closures raise it in their order

    gen.names.update(PV=clean_value, SLOW=slow, JE=JSONataError, ERRORS=_ERRORS,
                     BUDGET=default_budget)  # fmt: skip
    body = gen.lines
    head = [
        "def evaluate(data, bindings=None, budget=BUDGET):",
        "    if bindings or (data.__class__ is not D and isinstance(data, L)):",
        "        return SLOW(data, bindings, budget)",
        "    try:",
    ]
    if gen.uses_length:
        head.append("        ML = budget.max_length")
    if gen.uses_steps:
        head.append("        N = budget.max_steps")
    tail = [f"        return {r}" if clean else
            f"        return PV({r}) if isinstance({r}, (D, L)) else {r}",
            "    except JE:",
            "        raise",
            "    except ERRORS:",
            "        return SLOW(data, bindings, budget)"]  # fmt: skip
    source = "\n".join(head + body + tail)
    namespace = dict(gen.names)
    exec(compile(source, "<jsonata fast path>", "exec"), namespace)  # noqa: S102 - no user text
    fn: Callable[..., Any] = namespace["evaluate"]
    fn.__doc__ = source  # for debugging: the generated source
    return fn
