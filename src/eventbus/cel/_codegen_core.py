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
from typing import Any, Final

from eventbus.cel import _arith, _containers, _logic, _runtime
from eventbus.cel import _ast as ast
from eventbus.cel._budget import Budget
from eventbus.cel._errors import CELError
from eventbus.cel._values import CelType, Duration, Timestamp, UInt

__all__ = ["Code", "GeneratorCore", "qualified_name"]

_TYPE_CONSTANTS: Final = {
    "int": "int", "uint": "uint", "double": "double", "bool": "bool", "string": "string",
    "bytes": "bytes", "list": "list", "map": "map", "null_type": "null_type",
    "google.protobuf.Timestamp": "google.protobuf.Timestamp",
    "google.protobuf.Duration": "google.protobuf.Duration",
}  # fmt: skip
_FOLDABLE_TYPES: Final = (
    type(None), bool, int, UInt, float, str, bytes, CelType,
    _dt.datetime, _dt.timedelta, Timestamp, Duration,
)  # fmt: skip

Code = tuple[str, str | None]  # (python source, static CEL kind or None for dyn)

# Compile-time folding: what a constant subexpression may cost and produce.
_FOLD_MAX_ITERATIONS: Final = 10_000
_FOLD_MAX_SIZE: Final = 10_000


def _static_kind(value: object) -> str | None:
    if type(value) in _FOLDABLE_TYPES:
        return _runtime.kind(value)
    return None


class GeneratorCore:
    """Names, dispatch, folding, variables and selection: what every node's code builds on.

    ``OperatorGenerator`` (``_codegen_ops``) adds operators and literals, ``Generator``
    (``_codegen``) calls and comprehensions.
    """

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
        sub = type(self)(self.source, self.declared, {}, fast=False, fold=False, budget=True)
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
        qualified = qualified_name(node)
        if qualified in _TYPE_CONSTANTS:
            root = qualified.split(".")[0]
            if not self.is_local(root) and (self.declared is None or root not in self.declared):
                return self.const(CelType(_TYPE_CONSTANTS[qualified])), "type"
        operand, _ = self.gen(node.operand)
        if node.test_only:
            return f"{self.helper(_containers.has_field)}({operand}, {node.field!r})", "bool"
        if node.optional:
            return f"{self.helper(_containers.opt_select)}({operand}, {node.field!r})", None
        if self.fast:
            return f"{operand}[{node.field!r}]", None
        return f"{self.helper(_containers.select)}({operand}, {node.field!r})", None

    def gen_Index(self, node: ast.Index) -> Code:
        operand, _ = self.gen(node.operand)
        index, kind = self.gen(node.index)
        if node.optional:
            return f"{self.helper(_containers.opt_index)}({operand}, {index})", None
        if self.fast and kind == "string" and isinstance(node.index, ast.Lit):
            return f"{operand}[{index}]", None
        return f"{self.helper(_containers.index)}({operand}, {index})", None

    # -- operators ---------------------------------------------------------------

    def ns_value(self, text: str) -> object:
        try:
            return eval(text, dict(self.ns))
        except Exception:  # noqa: BLE001
            return None

    def is_local(self, name: str) -> bool:
        return any(name in scope for scope in self.scopes)

    def check_bool(self, code: Code, op: str) -> str:
        text, kind = code
        if kind == "bool":
            return text
        return f"{self.helper(_arith.check_bool)}({text}, {op!r})"


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


def qualified_name(node: ast.Node) -> str | None:
    if isinstance(node, ast.Ident):
        return node.name
    if isinstance(node, ast.Select) and not node.test_only and not node.optional:
        base = qualified_name(node.operand)
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
