"""Code generator, operators and literals: ``!``, ``-``, ``&&``, ``||``, ``?:``, ``==``,
ordering, arithmetic, ``in``, list and map literals (see ``_codegen_core`` for the two paths)."""

from __future__ import annotations

from typing import Any, Final

from eventbus.cel import _arith, _containers, _logic, _runtime
from eventbus.cel import _ast as ast
from eventbus.cel._codegen_core import Code, GeneratorCore
from eventbus.cel._values import UInt

__all__ = ["OperatorGenerator"]

_CMP_OPS: Final = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
_ARITH: Final = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod"}
_SCALAR_KINDS: Final = frozenset(
    {"bool", "int", "uint", "double", "null", "timestamp", "duration", "type"}
)


class OperatorGenerator(GeneratorCore):
    """Generates the code of operators and literals."""

    # -- operators ---------------------------------------------------------------
    def gen_Unary(self, node: ast.Unary) -> Code:
        operand, kind = self.gen(node.operand)
        if node.op == "!":
            if self.fast and kind == "bool":
                return f"(not {operand})", "bool"
            return f"{self.helper(_arith.not_)}({operand})", "bool"
        result_kind = kind if kind in ("int", "double") else None
        return f"{self.helper(_arith.neg)}({operand})", result_kind

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
                return (
                    f"{self.helper(_containers.in_)}({item}, {self.const(tuple(values))})",
                    "bool",
                )
        coll, _ = self.gen(container)
        return f"{self.helper(_containers.in_)}({item}, {coll})", "bool"

    # -- literals --------------------------------------------------------------
    def gen_ListLit(self, node: ast.ListLit) -> Code:
        items = [self.gen(i)[0] for i in node.items]
        if node.optional:
            inner = "".join(f"{i}, " for i in items)
            opt = self.const(node.optional)
            return f"{self.helper(_containers.make_list)}(({inner}), {opt})", "list"
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
    return _containers.make_map(pairs)
