"""The fast path's calls of the standard library, comparisons and code constants (a mixin
of the generator in :mod:`eventbus.jsonata._fast`), and the placeholders' replacement."""

from __future__ import annotations

from types import CodeType
from typing import TYPE_CHECKING, Any

from eventbus.jsonata import _fast_rt as rt
from eventbus.jsonata._fast_paths import ATTRS, CLEAN_RESULTS, COMPARE, FUNCTIONS, Unsupported
from eventbus.jsonata._ops import binary_fn
from eventbus.jsonata._parser import Node
from eventbus.jsonata._values import Builtin

__all__ = ["CallForms", "patched"]


class CallForms:
    """Mixin of the generator: calls, comparisons, literals."""

    names: dict[str, Any]
    literals: dict[str, Any]
    builtins: dict[str, Any]
    nodes: int
    uses_length: bool
    flagged: set[str]

    if TYPE_CHECKING:  # the generator's (mixed in beside); nothing defined here at run time

        def emit(self, ind: int, line: str) -> None: ...

        def tmp(self) -> str: ...

        def const(self, value: Any) -> str: ...

        def expr(self, node: Node, c: str, ind: int) -> tuple[str, bool]: ...

    def lit(self, value: Any) -> str:
        """``value`` as a constant of the code object (no global lookup): a placeholder string
        literal in the source, replaced by the value once compiled (see :func:`patched`). Only
        where no other constant is an operand, so that nothing folds it at compile time."""
        placeholder = f"\x00{len(self.literals)}"
        self.literals[placeholder] = value
        return repr(placeholder)

    def lits(self, a: str, b: str) -> tuple[str, str]:
        """Operands ``a`` and ``b`` with a literal one (beside a value) as a code constant."""
        ka, kb = a[0] == "K" and a in self.names, b[0] == "K" and b in self.names
        if ka and not kb:
            return self.lit(self.names[a]), b
        if kb and not ka:
            return a, self.lit(self.names[b])
        return a, b

    def compare(self, op: str, a: str, b: str, slow: str) -> str:
        """A comparison of ``a`` and ``b``: Python's where both are strings or both numbers."""
        kinds = {str: "S", int: "I", float: "F"}
        if b in self.names and self.names[b].__class__ in kinds:  # a literal: its type known
            same = f"{a}.__class__ is {kinds[self.names[b].__class__]}"
        elif a in self.names and self.names[a].__class__ in kinds:
            same = f"{b}.__class__ is {kinds[self.names[a].__class__]}"
        else:
            same = f"{a}.__class__ is {b}.__class__ and ({a}.__class__ is S or "
            same += f"{a}.__class__ is I or {a}.__class__ is F)"
        pyop = "==" if op == "=" else op
        la, lb = self.lits(a, b)
        return f"{la} {pyop} {lb} if {same} else {slow}(({a}, {b}), None)"

    def test(self, node: Node, c: str, ind: int) -> str:
        """A condition that holds where the node's value is ``true`` (for a predicate)."""
        if (node.type == "binary" and node.value in COMPARE
                and not any(node.get(a) for a in ATTRS)):  # fmt: skip
            self.nodes += 1
            a, _ = self.expr(node.lhs, c, ind)
            b, _ = self.expr(node.rhs, c, ind)
            slow = self.const(binary_fn(node.value, rt.first, rt.second, node.position))
            return f"({self.compare(node.value, a, b, slow)} is True)"
        p, _ = self.expr(node, c, ind)
        return f"{p} is True"

    def strict(self, node: Node, x: str) -> str | None:
        """The value of the call step ``node`` on the string ``x`` where it is a function of
        ``$`` with a form for strings (never undefined, never an error), else None."""
        proc = node.procedure
        if (node.type != "function" or proc.type != "variable" or any(proc.get(a) for a in ATTRS)
                or len(node.arguments) != 1 or self.builtins.get(proc.value).__class__ is not Builtin):  # fmt: skip
            return None
        arg = node.arguments[0]
        if arg.type != "variable" or arg.value != "" or any(arg.get(a) for a in ATTRS):
            return None
        forms = {"uppercase": f"{x}.upper()", "lowercase": f"{x}.lower()", "string": x,
                 "length": f"len({x})"}  # fmt: skip
        return forms.get(proc.value)

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
            joiner = self.lit(self.names[sep]) if self.names.get(sep).__class__ is str else sep
            self.emit(ind + 2, f"{r} = {joiner}.join({a})")
            self.emit(ind + 2, f"if len({r}) > ML: TL(len({r}), ML)")
            self.uses_length = True
            self.emit(ind + 1, f"except TypeError: {r} = {slow}; UF = True")
            self.emit(ind, f"else: {r} = {slow}; UF = True")
            self.flagged.add(r)
        else:
            self.emit(ind, f"{r} = {slow}")
        return r, name in CLEAN_RESULTS


def patched(code: CodeType, literals: dict[str, Any]) -> CodeType:
    """``code`` with each placeholder constant replaced by its value (in nested code too)."""

    def value(c: Any) -> Any:
        if c.__class__ is str and "\x00" in c:
            if c not in literals:  # folded with something at compile time: not as planned
                raise Unsupported("folded literal")
            return literals[c]
        if c.__class__ is tuple:
            return tuple(value(x) for x in c)
        if c.__class__ is frozenset:
            return frozenset(value(x) for x in c)
        if isinstance(c, CodeType):
            return patched(c, literals)
        return c

    return code.replace(co_consts=tuple(value(c) for c in code.co_consts))
