"""CEL macros: ``has()``, the comprehensions (``all``, ``exists``, ``map``, ``filter``,
``transform*``, ``optMap``), ``cel.bind``, ``cel.block`` and ``cel.index``, expanded into the
AST as the parser meets a call (``source`` is the expression, for the error's position)."""

from __future__ import annotations

from typing import Final

from eventbus.cel import _ast as ast
from eventbus.cel._errors import CELError

__all__ = ["make_call"]

# macro name -> accepted argument counts (receiver-style macros)
_MEMBER_MACROS: Final = {
    "all": (2, 3),
    "exists": (2, 3),
    "exists_one": (2, 3),
    "existsOne": (2, 3),
    "map": (2, 3),
    "filter": (2,),
    "transformList": (3, 4),
    "transformMap": (3, 4),
    "transformMapEntry": (3, 4),
    "optMap": (2,),
    "optFlatMap": (2,),
}


def _error(source: str, message: str, pos: int) -> CELError:
    return CELError(message, source, pos + 1)


def make_call(
    source: str, name: str, target: ast.Node | None, args: list[ast.Node], pos: int
) -> ast.Node:
    """The call ``target.name(args)`` (or ``name(args)``), or the macro it names expanded."""
    if target is None:
        if name == "has":
            if len(args) != 1:
                raise _error(source, "has() macro takes exactly one argument", pos)
            arg = args[0]
            if not isinstance(arg, ast.Select) or arg.optional or arg.test_only:
                raise _error(source, "invalid argument to has() macro", arg.pos)
            return ast.Select(arg.pos, arg.operand, arg.field, test_only=True)
        return ast.Call(pos, name, None, args)
    qualified = _qualified_name(target)
    if qualified == "cel":
        return cel_macro(source, name, args, pos)
    if name in _MEMBER_MACROS and len(args) in _MEMBER_MACROS[name]:
        return member_macro(source, name, target, args, pos)
    return ast.Call(pos, name, target, args)


def var_name(source: str, node: ast.Node) -> str:
    if isinstance(node, ast.Ident) and "." not in node.name:
        return node.name
    raise _error(source, "macro variable must be a simple identifier", node.pos)


def member_macro(
    source: str, name: str, target: ast.Node, args: list[ast.Node], pos: int
) -> ast.Node:
    if name in ("optMap", "optFlatMap"):
        return ast.Comprehension(pos, name, target, var_name(source, args[0]), None, args[1])
    two_var = name.startswith("transform") or (name != "map" and len(args) == 3)
    var = var_name(source, args[0])
    var2 = var_name(source, args[1]) if two_var else None
    if var2 is not None and var2 == var:
        raise _error(source, f"duplicate iteration variable '{var}'", args[1].pos)
    rest = args[2:] if two_var else args[1:]
    kind = "exists_one" if name == "existsOne" else name
    if kind == "map" or kind.startswith("transform"):
        pred = rest[0] if len(rest) == 2 else None
        return ast.Comprehension(pos, kind, target, var, var2, rest[-1], pred)
    return ast.Comprehension(pos, kind, target, var, var2, rest[0])


def cel_macro(source: str, name: str, args: list[ast.Node], pos: int) -> ast.Node:
    if name == "bind" and len(args) == 3:
        return ast.Comprehension(pos, "bind", args[1], var_name(source, args[0]), None, args[2])
    if name == "block" and len(args) == 2:
        if not isinstance(args[0], ast.ListLit) or args[0].optional:
            raise _error(source, "cel.block requires a list literal of bindings", args[0].pos)
        return ast.Block(pos, list(args[0].items), args[1])
    if name in ("index", "iterVar", "accuVar"):
        values: list[int] = []
        for arg in args:
            if not isinstance(arg, ast.Lit) or type(arg.value) is not int or arg.value < 0:
                raise _error(source, f"cel.{name} requires non-negative int literals", arg.pos)
            values.append(arg.value)
        if name == "index" and len(values) == 1:
            return ast.Ident(pos, f"@index{values[0]}")
        if name != "index" and len(values) == 2:
            prefix = "@it" if name == "iterVar" else "@ac"
            return ast.Ident(pos, f"{prefix}:{values[0]}:{values[1]}")
    raise _error(source, f"undeclared reference to function 'cel.{name}'", pos)


def _qualified_name(node: ast.Node) -> str | None:
    if isinstance(node, ast.Ident):
        return node.name
    if isinstance(node, ast.Select) and not node.test_only and not node.optional:
        base = _qualified_name(node.operand)
        return None if base is None else f"{base}.{node.field}"
    return None
