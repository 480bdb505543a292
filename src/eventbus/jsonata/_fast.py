"""The fast path: an expression of a common subset compiled to the source of one Python
function (``compile()`` once), which replaces :meth:`Expression.evaluate` for that expression.

The subset: paths of names (mapping over arrays and flattening, as every path does),
predicates ``[...]`` on their steps, function-call steps (``.$uppercase($)``), ``$``, literals,
``+ - * / %``, comparisons, ``=``/``!=``, ``and``/``or``, ``&``, ``? :``, unary minus, array and object
constructors (literal, distinct keys), and calls of :data:`FUNCTIONS`. Anything else (and
bindings passed to ``evaluate``, or an input other than an object) runs the closures instead.
A case the generated code does not handle inline calls the same helpers the closures use, or
raises :class:`~eventbus.jsonata._fast_rt.Fallback` to evaluate the closures once more, so the
results and error codes are the closures'.

What it saves per evaluation: a path of names is subscripts (``try``/``except``, free until a
key is missing) while it meets objects; a filter followed by a string function on ``$``
(``tags[$ != 'eu'].$uppercase($)``) runs in one loop; the expression's own list is returned as
built; undefined values, which only the slow branches produce, set one flag (``UF``) that an
object constructor tests once.

The input is an object (``dict`` exactly) holding JSON as ``json.loads`` gives it: inside it,
an object is a ``dict`` and nothing else answers a subscript by a string (an array, a string,
a number raise ``TypeError``, read as "not an object": the helper maps over an array). A
mapping of another kind nested in the input (a ``defaultdict``, a ``UserDict``) would be
read by its subscript here, where the closures take only a ``dict`` for an object.

No text from the expression enters the source: a literal is a name of the function's
namespace (``K<n>``), or, where it is an operand beside a value, a placeholder string that
:func:`~eventbus.jsonata._fast_forms.patched` replaces by the value in the compiled code's
constants (a constant loads faster than a name).

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
from eventbus.jsonata._fast_forms import CallForms, patched
from eventbus.jsonata._fast_paths import (
    ATTRS,
    COMPARE,
    FUNCTIONS,
    MAX_INDENT,
    MAX_NODES,
    PathForms,
    Unsupported,
)
from eventbus.jsonata._ops import binary_fn
from eventbus.jsonata._parser import Node
from eventbus.jsonata._values import UNDEFINED, Cons, Seq, to_boolean

__all__ = ["FUNCTIONS", "generate"]


class _Gen(PathForms, CallForms):
    def __init__(self, builtins: dict[str, Any]) -> None:
        self.builtins = builtins
        self.top: Node | None = None  # the whole expression (its value is returned as it is)
        self.lines: list[str] = []
        self.literals: dict[str, Any] = {}  # placeholder -> value, for the code's constants
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
        # temporaries whose every assignment that may be undefined sets UF (one test for all)
        self.flagged: set[str] = set()
        self.uses_flag = False
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
            parts = [lx if self.names.get(x).__class__ is str else
                     f"({x} if {x}.__class__ is S else SP({x}))"
                     for x, lx in zip((a, b), self.lits(a, b), strict=True)]  # fmt: skip
            self.emit(ind, f"{r} = {parts[0]} + {parts[1]}")
            self.emit(ind, f"if len({r}) > ML: TL(len({r}), ML)")
            self.uses_length = True
            self.defined.add(r)
            return r, True
        slow = self.const(binary_fn(op, rt.first, rt.second, node.position))
        la, lb = self.lits(a, b)
        num_a = f"({a}.__class__ is F or {a}.__class__ is I)"
        num_b = f"({b}.__class__ is F or {b}.__class__ is I)"
        if op in ("+", "-", "*"):
            if node.rhs.type == "number":  # a literal number (the check below sees inf)
                self.emit(ind, f"if {num_a}:")
            else:
                self.emit(ind, f"if {num_a} and {num_b}:")
            self.emit(ind + 1, f"{r} = {la} {op} {lb}")
            again = f"{r} = {slow}(({a}, {b}), None); UF = True"  # the closures' verdict
            self.flagged.add(r)
            if float in (self.names.get(a).__class__, self.names.get(b).__class__):
                self.emit(ind + 1, f"if {r} - {r}: {again}")  # a float literal: a float
            else:  # x - x: 0 for a finite number, nan (truthy) for inf and nan
                self.emit(ind + 1, f"if {r}.__class__ is F:")
                self.emit(ind + 2, f"if {r} - {r}: {again}")
                self.emit(ind + 1, f"elif not -9223372036854775808 < {r} < 9223372036854775808: "
                                   f"{again}")  # fmt: skip
            self.emit(ind, f"else: {again}")
            return r, True
        if op in ("/", "%"):
            self.emit(ind, f"{r} = {slow}(({a}, {b}), None)")
            return r, False
        self.emit(ind, f"{r} = {self.compare(op, a, b, slow)}")
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
            k = self.lit(key)
            if v not in self.defined and (v not in self.names or self.names[v] is UNDEFINED):
                maybe.append(v)
            elif ok and v[0] == "K" and v in self.names:
                v = self.lit(self.names[v])  # a literal value
            entries.append(
                f"{k}: {v}"
                if ok
                else f"{k}: {v} if {v}.__class__ is S or {v}.__class__ is I else PV({v})"
            )
        self.emit(ind, f"{r} = {{{', '.join(entries)}}}")
        if maybe:  # undefined values leave their keys out (the others keep their order)
            tests = [f"{v} is U" for v in dict.fromkeys(maybe) if v not in self.flagged]
            self.uses_flag = self.uses_flag or bool(set(maybe) & self.flagged)
            test = " or ".join((["UF"] if set(maybe) & self.flagged else []) + tests)
            self.emit(ind, f"if {test}: {r} = {{k: x for k, x in {r}.items() if x is not U}}")
        self.defined.add(r)
        return r, True


_PLAIN_ITEMS = frozenset([str, int, bool, type(None)])
_ERRORS = (TypeError, AttributeError, KeyError, IndexError, ValueError, ArithmeticError,
           RecursionError, rt.Fallback)  # fmt: skip


def generate(tree: Node, builtins: dict[str, Any], slow: Callable[..., Any],
             plain: Callable[[Any], Any], default_budget: Any) -> Callable[..., Any] | None:  # fmt: skip
    """The generated ``evaluate(data, bindings=None, budget=...)``, or None outside the subset."""
    gen = _Gen(builtins)
    gen.top = tree
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
        "def evaluate(data, bindings=None, budget=BUDGET):",  # an object in, else the closures
        "    if bindings or data.__class__ is not D:",
        "        return SLOW(data, bindings, budget)",
        "    try:",
    ]
    if gen.uses_length:
        head.append("        ML = budget.max_length")
    if gen.uses_steps:
        head.append("        N = budget.max_steps")
    if gen.uses_flag:
        head.append("        UF = False")
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
        code = patched(compile(source, "<jsonata fast path>", "exec"), gen.literals)
    except (SyntaxError, RecursionError, Unsupported):  # e.g. more nested blocks than Python
        return None  # compiles: the closures
    exec(code, namespace)
    fn: Callable[..., Any] = namespace["evaluate"]
    fn.__doc__ = source  # for debugging: the generated source
    return fn
