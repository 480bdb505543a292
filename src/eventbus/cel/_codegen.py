"""Code generator: CEL AST to Python source, compiled once per expression.

Two versions of each expression are generated from one AST:

* the *fast* path: plain Python operators with cheap inline type guards
  (``type(x) is float``), string-literal subscripts for field selection,
  Python's short-circuit ``and``/``or``, literal lists folded to frozensets.
  It is exact whenever it returns; any CEL error surfaces as some exception.
* the *slow* path: only exact runtime helpers, error-absorbing ``&&``/``||``
  and macros (thunks), and precise error messages.

The program runs the fast path and, if it raises, re-runs the slow path (CEL
is side-effect free), which either returns the right value (an absorbed
error) or raises the right ``CELError``.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import math
from collections.abc import Collection
from typing import Any, Final

from eventbus.cel import _arith, _logic, _runtime
from eventbus.cel import _ast as ast
from eventbus.cel._budget import BUDGETED, Budget
from eventbus.cel._errors import CELError, EvalError
from eventbus.cel._functions import FUNCTIONS, function_names
from eventbus.cel._lexer import RESERVED
from eventbus.cel._regex import compile_regex
from eventbus.cel._values import CelType, Duration, Timestamp, UInt

__all__ = ["Generator", "needs_budget"]

_TYPE_CONSTANTS: Final = {
    "int": "int", "uint": "uint", "double": "double", "bool": "bool", "string": "string",
    "bytes": "bytes", "list": "list", "map": "map", "null_type": "null_type",
    "google.protobuf.Timestamp": "google.protobuf.Timestamp",
    "google.protobuf.Duration": "google.protobuf.Duration",
}  # fmt: skip
_CMP_OPS: Final = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
_ARITH: Final = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod"}
_BOOL_CALLS: Final = frozenset(
    {"contains", "startsWith", "endsWith", "matches", "isNaN", "isInf", "isFinite", "hasValue"}
)
_FOLDABLE_TYPES: Final = (
    type(None), bool, int, UInt, float, str, bytes, CelType,
    _dt.datetime, _dt.timedelta, Timestamp, Duration,
)  # fmt: skip

Code = tuple[str, str | None]  # (python source, static CEL kind or None for dyn)

_SCALAR_KINDS: Final = frozenset(
    {"bool", "int", "uint", "double", "null", "timestamp", "duration", "type"}
)
# Calls that build a new string or list of the size of their input: charged in budgeted
# expressions (join, replace, format and split have budgeted versions in _budget).
_GROWING_CALLS: Final = frozenset(
    {"string", "bytes", "charAt", "lowerAscii", "upperAscii", "substring", "trim",
     "reverse", "quote", "strings.quote"}
)  # fmt: skip
# Calls whose output can be much larger than their input.
_GROWTH_FUNCTIONS: Final = frozenset({"join", "replace", "format"})
# Compile-time folding: what a constant subexpression may cost and produce.
_FOLD_MAX_ITERATIONS: Final = 10_000
_FOLD_MAX_SIZE: Final = 10_000


def _static_kind(value: object) -> str | None:
    if type(value) in _FOLDABLE_TYPES:
        return _runtime.kind(value)
    return None


class Generator:
    """Generates the Python source of one path (fast or slow) of an expression."""

    def __init__(
        self,
        source: str,
        declared: frozenset[str] | None,
        namespace: dict[str, Any],
        *,
        fast: bool,
        fold: bool = True,
        budget: bool = False,
    ) -> None:
        self.source = source
        # Charge the evaluation's budget (the local `_b`) where values can grow.
        self.budget = budget
        self.declared = declared
        self.ns = namespace
        self.fast = fast
        self.fold = fold
        self.scopes: list[dict[str, str]] = []
        self.refs: set[str] = set()
        self.no_walrus = 0
        # top-level variables referenced more than once: looked up once, up front
        self.hoisted: dict[str, str] = {}
        self.hoistable: frozenset[str] = frozenset()
        self._ids: dict[int, str] = {}
        self._counter = 0

    # -- names -----------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"_{prefix}{self._counter}_{'f' if self.fast else 's'}"

    def const(self, value: object) -> str:
        """A name in the namespace bound to ``value`` (shared across paths)."""
        key = id(value)
        name = self._ids.get(key)
        if name is None:
            name = f"_k{len(self.ns)}"
            self.ns[name] = value
            self._ids[key] = name
        return name

    def helper(self, fn: Any) -> str:
        return self.const(fn)

    def literal(self, value: object) -> str:
        t = type(value)
        if value is None or t is bool or t is int or t is str or t is bytes:
            return repr(value)
        if t is float and math.isfinite(value):  # type: ignore[arg-type]
            return repr(value)
        return self.const(value)

    def error(self, message: str, node: ast.Node) -> CELError:
        return CELError(message, self.source, node.pos + 1)

    # -- entry -----------------------------------------------------------------
    def expression(self, node: ast.Node) -> str:
        if self.fast:
            counts: dict[str, int] = {}
            bound: set[str] = set()
            _count_idents(node, counts, bound)
            self.hoistable = frozenset(n for n, c in counts.items() if c > 1 and n not in bound)
        return self.gen(node)[0]

    def prologue(self) -> list[str]:
        """Statements binding the hoisted variables (fast path only)."""
        return [f"{py} = v[{name!r}]" for name, py in sorted(self.hoisted.items())]

    def gen(self, node: ast.Node) -> Code:
        if self.fold and not isinstance(node, ast.Lit) and _is_constant(node):
            folded = self.try_fold(node)
            if folded is not None:
                return folded
        method = getattr(self, f"gen_{type(node).__name__}")
        return method(node)  # type: ignore[no-any-return]

    def try_fold(self, node: ast.Node) -> Code | None:
        # Folding runs the expression at compile time, under a small budget of its own: a
        # constant that would be large ('x'.replace('', ...), '%.99999999f'.format(...))
        # is left to run time, where the evaluation's budget applies.
        sub = Generator(self.source, self.declared, {}, fast=False, fold=False, budget=True)
        code = sub.expression(node)
        sub.ns["_b"] = Budget(_FOLD_MAX_ITERATIONS, _FOLD_MAX_SIZE)
        try:
            value = eval(code, sub.ns, {"v": {}})
        except Exception:  # noqa: BLE001 - not foldable: the error surfaces at run time
            return None
        if type(value) not in _FOLDABLE_TYPES:
            return None
        if type(value) in (str, bytes) and len(value) > _FOLD_MAX_SIZE:
            return None
        return self.literal(value), _static_kind(value)

    def guard_temp(self) -> str | None:
        """A temporary for inline guards, or None where walrus is not allowed."""
        return None if self.no_walrus or not self.fast else self.fresh("t")

    # -- leaves ------------------------------------------------------------------
    def gen_Lit(self, node: ast.Lit) -> Code:
        return self.literal(node.value), _static_kind(node.value)

    def gen_Ident(self, node: ast.Ident) -> Code:
        name = node.name
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name], None
        if name.startswith("@"):
            raise self.error(f"undeclared reference to '{name}'", node)
        is_var = name == "type" or (self.declared is not None and name in self.declared)
        if not is_var and name in _TYPE_CONSTANTS:
            return self.const(CelType(_TYPE_CONSTANTS[name])), "type"
        if self.declared is not None and name not in self.declared:
            hint = difflib.get_close_matches(name, sorted(self.declared), n=1)
            extra = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise self.error(f"undeclared reference to '{name}'{extra}", node)
        self.refs.add(name)
        if self.fast and name in self.hoistable:
            py = self.hoisted.setdefault(name, f"_v_{name}")
            return py, None
        if self.fast:
            return f"v[{name!r}]", None
        return f"{self.helper(_logic.lookup_var)}(v, {name!r})", None

    # -- selection and indexing ------------------------------------------------------
    def gen_Select(self, node: ast.Select) -> Code:
        qualified = _qualified(node)
        if qualified in _TYPE_CONSTANTS:
            root = qualified.split(".")[0]
            if not self.is_local(root) and (self.declared is None or root not in self.declared):
                return self.const(CelType(_TYPE_CONSTANTS[qualified])), "type"
        operand, _ = self.gen(node.operand)
        if node.test_only:
            return f"{self.helper(_runtime.has_field)}({operand}, {node.field!r})", "bool"
        if node.optional:
            return f"{self.helper(_runtime.opt_select)}({operand}, {node.field!r})", None
        if self.fast:
            return f"{operand}[{node.field!r}]", None
        return f"{self.helper(_runtime.select)}({operand}, {node.field!r})", None

    def gen_Index(self, node: ast.Index) -> Code:
        operand, _ = self.gen(node.operand)
        index, kind = self.gen(node.index)
        if node.optional:
            return f"{self.helper(_runtime.opt_index)}({operand}, {index})", None
        if self.fast and kind == "string" and isinstance(node.index, ast.Lit):
            return f"{operand}[{index}]", None
        return f"{self.helper(_runtime.index)}({operand}, {index})", None

    # -- operators ---------------------------------------------------------------
    def gen_Unary(self, node: ast.Unary) -> Code:
        operand, kind = self.gen(node.operand)
        if node.op == "!":
            if self.fast and kind == "bool":
                return f"(not {operand})", "bool"
            return f"{self.helper(_arith.not_)}({operand})", "bool"
        result_kind = kind if kind in ("int", "double") else None
        return f"{self.helper(_arith.neg)}({operand})", result_kind

    def check_bool(self, code: Code, op: str) -> str:
        text, kind = code
        if kind == "bool":
            return text
        return f"{self.helper(_arith.check_bool)}({text}, {op!r})"

    def gen_And(self, node: ast.And) -> Code:
        return self.logic(node.terms, "and", _logic.and_, "_&&_")

    def gen_Or(self, node: ast.Or) -> Code:
        return self.logic(node.terms, "or", _logic.or_, "_||_")

    def logic(self, terms: list[ast.Node], py_op: str, helper: Any, op: str) -> Code:
        if self.fast:
            parts = [self.check_bool(self.gen(t), op) for t in terms]
            return "(" + f" {py_op} ".join(parts) + ")", "bool"
        thunks = ", ".join(f"lambda: {self.gen(t)[0]}" for t in terms)
        return f"{self.helper(helper)}({thunks})", "bool"

    def gen_Cond(self, node: ast.Cond) -> Code:
        cond = self.check_bool(self.gen(node.cond), "_?_:_")
        then, k1 = self.gen(node.then)
        other, k2 = self.gen(node.otherwise)
        return f"({then} if {cond} else {other})", k1 if k1 == k2 else None

    def gen_Binary(self, node: ast.Binary) -> Code:
        op = node.op
        if op == "in":
            return self.gen_in(node)
        left = self.gen(node.left)
        right = self.gen(node.right)
        if op in ("==", "!="):
            return self.gen_eq(op, left, right, node)
        if op in _CMP_OPS:
            return self.gen_cmp(op, left, right, node)
        return self.gen_arith(op, left, right)

    def gen_eq(self, op: str, left: Code, right: Code, node: ast.Binary) -> Code:
        (a, ka), (b, kb) = left, right
        if self.fast:
            direct = (
                (ka == kb and ka in ("string", "int", "double", "bytes", "bool", "null"))
                or _plain_eq_literal(node.left, ka)
                or _plain_eq_literal(node.right, kb)
            )
            if kb == "null" or ka == "null":
                return f"({a} {'is' if op == '==' else 'is not'} {b})", "bool"
            if direct:
                return f"({a} {op} {b})", "bool"
        fn = _runtime.eq if op == "==" else _runtime.ne
        return f"{self.helper(fn)}({a}, {b})", "bool"

    def gen_cmp(self, op: str, left: Code, right: Code, node: ast.Binary) -> Code:
        (a, ka), (b, kb) = left, right
        helper = self.helper(getattr(_runtime, _CMP_OPS[op]))
        if self.fast:
            if ka == kb and ka in ("int", "double", "uint", "string", "bytes"):
                return f"({a} {op} {b})", "bool"
            if ka in ("string", "bytes") or kb in ("string", "bytes"):
                # Python raises TypeError for any other operand type: exact.
                return f"({a} {op} {b})", "bool"
            numeric = ("int", "double", "uint")
            small_left = _small_number(node.left)
            small_right = _small_number(node.right)
            if (small_left and kb in numeric) or (small_right and ka in numeric):
                return f"({a} {op} {b})", "bool"
            temp = self.guard_temp()
            if temp is not None and small_right and ka is None:
                slow = f"{helper}({temp}, {b})"
                return (
                    f"({temp} {op} {b} if type({temp} := {a}) is not bool else {slow})",
                    "bool",
                )
            if temp is not None and small_left and kb is None:
                slow = f"{helper}({a}, {temp})"
                return (
                    f"({a} {op} {temp} if type({temp} := {b}) is not bool else {slow})",
                    "bool",
                )
        return f"{helper}({a}, {b})", "bool"

    def gen_arith(self, op: str, left: Code, right: Code) -> Code:
        text, kind = self.arith(op, left, right)
        if self.budget and op == "+" and kind not in _SCALAR_KINDS:
            return f"_b.grow({text})", kind  # string, bytes and list concatenation
        return text, kind

    def arith(self, op: str, left: Code, right: Code) -> Code:
        (a, ka), (b, kb) = left, right
        fn = self.helper(getattr(_arith, _ARITH[op]))
        result: str | None = None
        if ka == kb and ka in ("int", "uint", "double"):
            result = ka
        elif op == "+" and "string" in (ka, kb):
            result = "string"
        elif "double" in (ka, kb) and op != "%":
            result = "double"
        if self.fast:
            if op == "+" and (ka == "string" or kb == "string"):
                return f"({a} + {b})", "string"
            if ka == kb == "double" and op != "/" and op != "%":
                return f"({a} {op} {b})", "double"
            temp = self.guard_temp()
            if temp is not None and op in "+-*" and kb == "double" and ka is None:
                return (
                    f"({temp} {op} {b} if type({temp} := {a}) is float else {fn}({temp}, {b}))",
                    "double",
                )
            if temp is not None and op in "+-*" and ka == "double" and kb is None:
                return (
                    f"({a} {op} {temp} if type({temp} := {b}) is float else {fn}({a}, {temp}))",
                    "double",
                )
        return f"{fn}({a}, {b})", result

    def gen_in(self, node: ast.Binary) -> Code:
        item, _ = self.gen(node.left)
        container = node.right
        if isinstance(container, ast.ListLit) and not container.optional:
            values = [e.value for e in container.items if isinstance(e, ast.Lit)]
            if len(values) == len(container.items):
                if self.fast and all(type(x) is str for x in values):
                    return f"({item} in {self.const(frozenset(values))})", "bool"
                return f"{self.helper(_runtime.in_)}({item}, {self.const(tuple(values))})", "bool"
        coll, _ = self.gen(container)
        return f"{self.helper(_runtime.in_)}({item}, {coll})", "bool"

    # -- literals --------------------------------------------------------------
    def gen_ListLit(self, node: ast.ListLit) -> Code:
        items = [self.gen(i)[0] for i in node.items]
        if node.optional:
            inner = "".join(f"{i}, " for i in items)
            opt = self.const(node.optional)
            return f"{self.helper(_runtime.make_list)}(({inner}), {opt})", "list"
        return "[" + ", ".join(items) + "]", "list"

    def gen_MapLit(self, node: ast.MapLit) -> Code:
        keys = [e[0] for e in node.entries]
        simple = all(isinstance(k, ast.Lit) and type(k.value) is str for k in keys) and len(
            {k.value for k in keys if isinstance(k, ast.Lit)}
        ) == len(keys)
        if simple and not any(e[2] for e in node.entries):
            body = ", ".join(f"{self.gen(k)[0]}: {self.gen(v)[0]}" for k, v, _ in node.entries)
            return "{" + body + "}", "map"
        pairs = []
        for key, value, opt in node.entries:
            k, v = self.gen(key)[0], self.gen(value)[0]
            pairs.append(f"({k}, {v}, {opt})")
        inner = "".join(f"{p}, " for p in pairs)
        return f"{self.helper(_make_map_entries)}(({inner}))", "map"

    # -- calls -------------------------------------------------------------------
    def gen_Call(self, node: ast.Call) -> Code:
        name, target, args = node.name, node.target, node.args
        member = target is not None
        if target is not None:
            qualified = _qualified(target)
            if (
                qualified is not None
                and (f"{qualified}.{name}", False) in FUNCTIONS
                and not self.is_local(qualified.split(".")[0])
            ):
                name, target, member = f"{qualified}.{name}", None, False
        overloads = FUNCTIONS.get((name, member))
        all_args = ([target] if target is not None else []) + list(args)
        if overloads is None:
            if member and name in RESERVED:
                joined = ", ".join(self.gen(a)[0] for a in all_args)
                return f"{self.helper(_unknown_function)}({name!r}, {joined})", None
            hint = difflib.get_close_matches(name, function_names(), n=1)
            extra = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise self.error(f"undeclared reference to function '{name}'{extra}", node)
        impl = overloads.get(len(all_args))
        if impl is None:
            counts = sorted(n - (1 if member else 0) for n in overloads)
            want = " or ".join(str(c) for c in counts[:3])
            raise self.error(f"function '{name}' takes {want} argument(s); got {len(args)}", node)
        codes = [self.gen(a) for a in all_args]
        if name == "matches" and len(codes) == 2 and codes[1][1] == "string":
            self.check_pattern(codes[1][0], all_args[1])
        return self.call_code(name, impl, codes)

    def check_pattern(self, text: str, node: ast.Node) -> None:
        """A literal (or constant) ``matches()`` pattern must be RE2 syntax."""
        pattern = self.ns_value(text)
        if isinstance(pattern, str):
            try:
                compile_regex(pattern)
            except EvalError as exc:
                raise self.error(exc.message, node) from None

    def call_code(self, name: str, impl: Any, codes: list[Code]) -> Code:
        if self.budget:
            budgeted = BUDGETED.get(impl)
            if budgeted is not None:
                args = ", ".join(["_b", *(c[0] for c in codes)])
                return f"{self.helper(budgeted)}({args})", _RESULT_KINDS.get(name)
            if name in _GROWING_CALLS:
                text, kind = self.plain_call(name, impl, codes)
                return f"_b.grow({text})", kind
        return self.plain_call(name, impl, codes)

    def plain_call(self, name: str, impl: Any, codes: list[Code]) -> Code:
        texts = [c[0] for c in codes]
        kinds = [c[1] for c in codes]
        if self.fast:
            if name == "dyn":
                return codes[0]
            if name in ("startsWith", "endsWith") and kinds[1] == "string":
                method = "startswith" if name == "startsWith" else "endswith"
                return f"{texts[0]}.{method}({texts[1]})", "bool"
            if name == "contains" and kinds[1] == "string":
                return f"({texts[0]}.find({texts[1]}) >= 0)", "bool"
            if name == "matches" and len(codes) == 2 and kinds[1] == "string":
                pattern = self.ns_value(texts[1])
                if isinstance(pattern, str):
                    # Checked by gen_Call: a literal pattern compiles.
                    regex = compile_regex(pattern)
                    return f"{self.const(regex.search)}({texts[0]})", "bool"
            temp = self.guard_temp()
            if name == "string" and temp is not None:
                slow = f"{self.helper(impl)}({temp})"
                return (
                    f"(str({temp}) if type({temp} := {texts[0]}) is int else {slow})",
                    "string",
                )
        kind = _RESULT_KINDS.get(name)
        if kind is None and name in _BOOL_CALLS:
            kind = "bool"
        return f"{self.helper(impl)}({', '.join(texts)})", kind

    def ns_value(self, text: str) -> object:
        try:
            return eval(text, dict(self.ns))
        except Exception:  # noqa: BLE001
            return None

    def is_local(self, name: str) -> bool:
        return any(name in scope for scope in self.scopes)

    # -- comprehensions ------------------------------------------------------------
    def gen_Comprehension(self, node: ast.Comprehension) -> Code:
        if node.kind == "bind":
            init, _ = self.gen(node.range)
            py = self.fresh("b")
            self.scopes.append({node.var: py})
            bound, kind = self.gen(node.body)
            self.scopes.pop()
            return f"(lambda {py}: {bound})({init})", kind
        self.no_walrus += 1
        rng, _ = self.gen(node.range)
        self.no_walrus -= 1
        if self.budget and node.kind not in ("optMap", "optFlatMap"):
            rng = f"_b.iterations({rng})"
        if node.kind in ("optMap", "optFlatMap"):
            py = self.fresh("x")
            self.scopes.append({node.var: py})
            mapped, _ = self.gen(node.body)
            self.scopes.pop()
            opt_fn = _logic.opt_map if node.kind == "optMap" else _logic.opt_flat_map
            return f"{self.helper(opt_fn)}({rng}, lambda {py}: {mapped})", None
        two = node.var2 is not None
        v1 = self.fresh("x")
        scope = {node.var: v1}
        targets = v1
        if two:
            assert node.var2 is not None
            v2 = self.fresh("y")
            scope[node.var2] = v2
            targets = f"{v1}, {v2}"
            source = f"{self.helper(_runtime.iter_pairs)}({rng})"
        else:
            source = f"{self.helper(_runtime.iter_range)}({rng})"
        self.scopes.append(scope)
        # Walrus targets inside a comprehension would bind in the enclosing
        # scope; they are allowed, but keep the loop bodies simple.
        body = self.gen(node.body)
        pred = self.gen(node.pred) if node.pred is not None else None
        self.scopes.pop()
        loop = f"for {targets} in {source}"
        kind = node.kind
        if kind in ("all", "exists"):
            if self.fast:
                fn = "all" if kind == "all" else "any"
                return f"{fn}({self.check_bool(body, kind)} {loop})", "bool"
            helper = _logic.all_ if kind == "all" else _logic.exists_
            return f"{self.helper(helper)}({rng}, lambda {targets}: {body[0]}, {two})", "bool"
        if kind == "exists_one":
            test = self.check_bool(body, "exists_one")
            return f"(sum(1 {loop} if {test}) == 1)", "bool"
        cond = f" if {self.check_bool(pred, kind)}" if pred is not None else ""
        if kind == "filter":
            return f"[{v1} {loop} if {self.check_bool(body, kind)}]", "list"
        if kind in ("map", "transformList"):
            return f"[{body[0]} {loop}{cond}]", "list"
        if kind == "transformMap":
            return f"{{{v1}: {body[0]} {loop}{cond}}}", "map"
        if kind == "transformMapEntry":
            return f"{self.helper(_logic.transform_map_entry)}([{body[0]} {loop}{cond}])", "map"
        raise self.error(f"unsupported macro '{kind}'", node)

    def gen_Block(self, node: ast.Block) -> Code:
        names: list[str] = []
        inits: list[str] = []
        scope: dict[str, str] = {}
        self.scopes.append(scope)
        for i, slot in enumerate(node.slots):
            inits.append(self.gen(slot)[0])
            py = self.fresh("i")
            scope[f"@index{i}"] = py
            names.append(py)
        assert node.body is not None
        body, kind = self.gen(node.body)
        self.scopes.pop()
        for py, init in reversed(list(zip(names, inits, strict=True))):
            body = f"(lambda {py}: {body})({init})"
        return body, kind


_RESULT_KINDS: Final = {
    "size": "int", "int": "int", "uint": "uint", "double": "double", "string": "string",
    "bytes": "bytes", "bool": "bool", "charAt": "string", "indexOf": "int",
    "lastIndexOf": "int", "lowerAscii": "string", "upperAscii": "string",
    "replace": "string", "substring": "string", "trim": "string", "join": "string",
    "reverse": "string", "format": "string", "strings.quote": "string", "quote": "string",
    "math.isNaN": "bool", "math.isInf": "bool", "math.isFinite": "bool",
}  # fmt: skip


def _count_idents(node: object, counts: dict[str, int], bound: set[str]) -> None:
    if isinstance(node, ast.Ident):
        counts[node.name] = counts.get(node.name, 0) + 1
        return
    if isinstance(node, ast.Comprehension):
        bound.add(node.var)
        if node.var2 is not None:
            bound.add(node.var2)
    if isinstance(node, ast.Node):
        for slot in type(node).__slots__:
            _count_idents(getattr(node, slot), counts, bound)
    elif isinstance(node, list | tuple):
        for item in node:
            _count_idents(item, counts, bound)


def _plain_eq_literal(node: ast.Node, kind: str | None) -> bool:
    """True if Python ``==`` against this literal is exactly CEL equality."""
    if not isinstance(node, ast.Lit):
        return False
    if kind in ("string", "bytes"):
        return True
    # True == 1 and True == 1.0 in Python; other numbers only equal numbers.
    if kind in ("int", "double", "uint"):
        return node.value not in (0, 1) and _small_number(node)
    return False


def _small_number(node: ast.Node) -> bool:
    """A numeric literal that Python compares with any number as CEL does.

    CEL compares int/uint with double by converting to double; Python compares
    exactly. Both agree whenever the literal's magnitude is below 2**53.
    """
    if not isinstance(node, ast.Lit) or type(node.value) not in (int, UInt, float):
        return False
    value: float = node.value  # type: ignore[assignment]
    return value == value and abs(value) < 2**53


def _qualified(node: ast.Node) -> str | None:
    if isinstance(node, ast.Ident):
        return node.name
    if isinstance(node, ast.Select) and not node.test_only and not node.optional:
        base = _qualified(node.operand)
        return None if base is None else f"{base}.{node.field}"
    return None


def _is_constant(node: ast.Node) -> bool:
    """True if ``node`` references no variable (so it can be folded)."""
    if isinstance(node, ast.Lit):
        return True
    if isinstance(node, ast.Ident | ast.Comprehension | ast.Block):
        return False
    if isinstance(node, ast.Select):
        return _is_constant(node.operand)
    if isinstance(node, ast.Index):
        return _is_constant(node.operand) and _is_constant(node.index)
    if isinstance(node, ast.Call):
        return (node.target is None or _is_constant(node.target)) and all(
            _is_constant(a) for a in node.args
        )
    if isinstance(node, ast.Unary):
        return _is_constant(node.operand)
    if isinstance(node, ast.Binary):
        return _is_constant(node.left) and _is_constant(node.right)
    if isinstance(node, ast.And | ast.Or):
        return all(_is_constant(t) for t in node.terms)
    if isinstance(node, ast.Cond):
        return all(_is_constant(n) for n in (node.cond, node.then, node.otherwise))
    if isinstance(node, ast.ListLit):
        return all(_is_constant(i) for i in node.items)
    if isinstance(node, ast.MapLit):
        return all(_is_constant(k) and _is_constant(v) for k, v, _ in node.entries)
    return False


def _make_map_entries(entries: tuple[tuple[Any, Any, bool], ...]) -> dict[Any, Any]:
    pairs = []
    for key, value, optional in entries:
        if optional:
            if type(value).__name__ != "Optional":
                _runtime.no_overload("optional map entry", value)
            if not value.has:
                continue
            value = value.value
        pairs.append((key, value))
    return _runtime.make_map(pairs)


def _unknown_function(name: str, *args: Any) -> Any:
    _runtime.no_overload(name, *args)


def check_declared(variables: Collection[str] | None) -> frozenset[str] | None:
    """Normalise the ``variables`` argument of ``compile``."""
    return None if variables is None else frozenset(variables)


def needs_budget(node: object) -> bool:
    """True if evaluating ``node`` can produce values much larger than its input.

    Comprehensions iterate over input-sized ranges, ``cel.bind``/``cel.block`` reuse a
    value many times, and ``join``/``replace``/``format`` can multiply sizes. Without
    them, each node is evaluated once and no value outgrows the input and the literals.
    """
    if isinstance(node, ast.Comprehension | ast.Block):
        return True
    if isinstance(node, ast.Call) and node.name in _GROWTH_FUNCTIONS:
        return True
    if isinstance(node, ast.Node):
        return any(needs_budget(getattr(node, slot)) for slot in type(node).__slots__)
    if isinstance(node, list | tuple):
        return any(needs_budget(item) for item in node)
    return False
