"""Code generator: CEL AST to Python source, compiled once per expression.

The generator is three layers: ``_codegen_core`` (names, dispatch, folding, variables and
selection, and how the fast and slow paths differ), ``_codegen_ops`` (operators and
literals) and this module (function calls, macros and comprehensions, ``cel.block``).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from typing import Any, Final

from eventbus.cel import _ast as ast
from eventbus.cel import _containers, _logic, _runtime
from eventbus.cel._budget import BUDGETED
from eventbus.cel._codegen_core import Code, qualified_name
from eventbus.cel._codegen_ops import OperatorGenerator
from eventbus.cel._errors import EvalError
from eventbus.cel._functions import FUNCTIONS, function_names
from eventbus.cel._lexer import RESERVED
from eventbus.cel._regex import compile_regex

__all__ = ["Generator", "needs_budget"]

_BOOL_CALLS: Final = frozenset(
    {"contains", "startsWith", "endsWith", "matches", "isNaN", "isInf", "isFinite", "hasValue"}
)
# Calls that build a new string or list of the size of their input: charged in budgeted
# expressions (join, replace, format and split have budgeted versions in _budget).
_GROWING_CALLS: Final = frozenset(
    {"string", "bytes", "charAt", "lowerAscii", "upperAscii", "substring", "trim",
     "reverse", "quote", "strings.quote"}
)  # fmt: skip
# Calls whose output can be much larger than their input.
_GROWTH_FUNCTIONS: Final = frozenset({"join", "replace", "format"})


class Generator(OperatorGenerator):
    """Generates the Python source of one path (fast or slow) of an expression."""

    def gen_Call(self, node: ast.Call) -> Code:
        name, target, args = node.name, node.target, node.args
        member = target is not None
        if target is not None:
            qualified = qualified_name(target)
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
            source = f"{self.helper(_containers.iter_pairs)}({rng})"
        else:
            source = f"{self.helper(_containers.iter_range)}({rng})"
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
