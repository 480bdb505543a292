"""The fast path: an expression of a common subset compiled to the source of one Python
function (``compile()`` once), which replaces :meth:`Expression.evaluate` for that expression.

The subset: paths of names (mapping over arrays and flattening, as every path does),
predicates ``[...]`` on their steps, function-call steps (``.$uppercase($)``), ``$``, literals,
``+ - * / %``, comparisons, ``=``/``!=``, ``and``/``or``, ``&``, ``? :``, unary minus, array and object
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
from eventbus.jsonata._fast_paths import (
    ATTRS,
    CLEAN_RESULTS,
    COMPARE,
    FUNCTIONS,
    MAX_INDENT,
    MAX_NODES,
    PathForms,
    Unsupported,
)
from eventbus.jsonata._ops import binary_fn
from eventbus.jsonata._parser import Node
from eventbus.jsonata._values import UNDEFINED, Builtin, Cons, Seq, to_boolean

__all__ = ["FUNCTIONS", "generate"]


class _Gen(PathForms):
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
        self.defined: set[str] = set()  # temporaries never undefined
        self.scalar_items: set[str] = set()  # temporaries holding scalars or sequences of them
        self.uses_length = False

    def const(self, value: Any) -> str:
        name = f"K{len(self.names)}"
        self.names[name] = value
        return name

    def tmp(self) -> str:
        self.n += 1
        return f"t{self.n}"

    def emit(self, ind: int, line: str) -> None:
        if ind > MAX_INDENT:
            raise Unsupported("nested too deeply")
        self.lines.append("    " * ind + line)

    # -- expressions: each emits statements and returns (a name holding the value, clean) where
    # clean means plain JSON by construction (no sequence, nothing non-finite)

    def expr(self, node: Node, c: str, ind: int) -> tuple[str, bool]:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise Unsupported("too large")
        t = node.type
        if t != "path" and any(node.get(a) for a in ATTRS):
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
        if t == "condition":
            return self.condition(node, c, ind)
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
        if op not in COMPARE and op not in ("+", "-", "*", "/", "%", "&"):
            raise Unsupported(op)
        a, _ = self.expr(node.lhs, c, ind)
        b, _ = self.expr(node.rhs, c, ind)
        if op == "&":
            parts = [x if self.names.get(x).__class__ is str else
                     f"({x} if {x}.__class__ is S else SP({x}))" for x in (a, b)]  # fmt: skip
            self.emit(ind, f"{r} = {parts[0]} + {parts[1]}")
            self.emit(ind, f"if len({r}) > ML: TL(len({r}), ML)")
            self.uses_length = True
            self.defined.add(r)
            return r, True
        slow = self.const(binary_fn(op, rt.first, rt.second, node.position))
        num_a = f"({a}.__class__ is I or {a}.__class__ is F)"
        num_b = f"({b}.__class__ is I or {b}.__class__ is F)"
        if op in ("+", "-", "*"):
            if node.rhs.type == "number":  # a literal number (the check below sees inf)
                self.emit(ind, f"if {num_a}:")
            else:
                self.emit(ind, f"if {num_a} and {num_b}:")
            self.emit(ind + 1, f"{r} = {a} {op} {b}")
            if float in (self.names.get(a).__class__, self.names.get(b).__class__):
                self.emit(ind + 1, f"if {r} - {r} != 0.0:")  # a float literal: a float
            else:
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

    def condition(self, node: Node, c: str, ind: int) -> tuple[str, bool]:
        r = self.tmp()
        test, _ = self.expr(node.condition, c, ind)
        self.emit(ind, f"if {test} is True or ({test} is not False and TB({test}) is True):")
        then, clean = self.expr(node.then, c, ind + 1)
        self.emit(ind + 1, f"{r} = {then}")
        self.emit(ind, "else:")
        if node.other is None:
            self.emit(ind + 1, f"{r} = U")
            return r, clean
        other, clean_other = self.expr(node.other, c, ind + 1)
        self.emit(ind + 1, f"{r} = {other}")
        return r, clean and clean_other

    def unary(self, node: Node, c: str, ind: int) -> tuple[str, bool]:

        r = self.tmp()
        if node.value == "-":
            a, _ = self.expr(node.expression, c, ind)
            neg = self.const(rt.negate(node.position))
            self.emit(
                ind, f"{r} = -{a} if {a}.__class__ is I or {a}.__class__ is F else {neg}({a})"
            )
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
        if c != "data":  # the input is never an array here
            self.emit(ind, f"if isinstance({c}, L): raise FB")
        entries, maybe = [], []
        for key, (_, value) in zip(keys, node.lhs, strict=True):
            v, ok = self.expr(value, c, ind)
            k = self.const(key)
            entries.append(
                f"{k}: {v}"
                if ok
                else f"{k}: {v} if {v}.__class__ is S or {v}.__class__ is I else PV({v})"
            )
            if v not in self.defined and (v not in self.names or self.names[v] is UNDEFINED):
                maybe.append(v)
        self.emit(ind, f"{r} = {{{', '.join(entries)}}}")
        if maybe:  # undefined values leave their keys out (the others keep their order)
            test = " or ".join(f"{v} is U" for v in dict.fromkeys(maybe))
            self.emit(ind, f"if {test}: {r} = {{k: x for k, x in {r}.items() if x is not U}}")
        self.defined.add(r)
        return r, True

    def call(self, node: Node, c: str, ind: int) -> tuple[str, bool]:
        proc = node.procedure
        if proc.type != "variable" or any(proc.get(a) for a in ATTRS):
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
            sep_ok = "" if self.names.get(sep).__class__ is str else f" and {sep}.__class__ is S"
            self.emit(ind, f"if {a}.__class__ is L{sep_ok}:")
            self.emit(ind + 1, "try:")
            self.emit(ind + 2, f"{r} = {sep}.join({a})")
            self.emit(ind + 2, f"if len({r}) > ML: TL(len({r}), ML)")
            self.uses_length = True
            self.emit(ind + 1, f"except TypeError: {r} = {slow}")
            self.emit(ind, f"else: {r} = {slow}")
        else:
            self.emit(ind, f"{r} = {slow}")
        return r, name in CLEAN_RESULTS

    # -- paths


_PLAIN_ITEMS = frozenset([str, int, bool, type(None)])
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
        if v.__class__ is Seq or v.__class__ is list:  # scalars only: plain() would copy it
            for x in v:
                if x.__class__ not in _PLAIN_ITEMS:
                    break
            else:
                return list(v)
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
        "        DD = data.__class__ is D",
    ]
    if gen.uses_length:
        head.append("        ML = budget.max_length")
    if gen.uses_steps:
        head.append("        N = budget.max_steps")
    if clean:
        ret = f"        return {r}"
    elif r in gen.scalar_items:
        ret = f"        return L({r}) if {r}.__class__ is Q else {r}"
    else:
        ret = f"        return PV({r}) if isinstance({r}, (D, L)) else {r}"
    tail = [ret,
            "    except JE:",
            "        raise",
            "    except ERRORS:",
            "        return SLOW(data, bindings, budget)"]  # fmt: skip
    source = "\n".join(head + body + tail)
    namespace = dict(gen.names)
    try:
        code = compile(source, "<jsonata fast path>", "exec")
    except (SyntaxError, RecursionError):  # more nested blocks than Python compiles: closures
        return None
    exec(code, namespace)
    fn: Callable[..., Any] = namespace["evaluate"]
    fn.__doc__ = source  # for debugging: the generated source
    return fn
