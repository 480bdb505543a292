"""The evaluation tree compiled once into nested Python closures ``fn(input, frame)``; an
evaluation runs those closures and never walks the tree again."""

from __future__ import annotations

from typing import Any

from eventbus.jsonata._compile_calls import FunctionForms
from eventbus.jsonata._compile_helpers import (
    bound_names,
    descendants,
    name_chain,
    tracked,
    unwrap,
    wildcard,
)
from eventbus.jsonata._errors import fail
from eventbus.jsonata._ops import binary_fn
from eventbus.jsonata._parser import Node
from eventbus.jsonata._paths import Fn, filter_fn, group_fn, lookup, path_fn, sort_step, stages_fn
from eventbus.jsonata._regex import Regex
from eventbus.jsonata._transform import transform_fn
from eventbus.jsonata._values import UNDEFINED, Cons, Frame, Seq, to_boolean

__all__ = ["Compiler", "bound_names"]

#: node types whose value may be a sequence to unwrap (a singleton to its item, empty to
#: undefined); the others produce plain values
_SEQUENCES = frozenset(["path", "name", "wildcard", "descendant", "variable", "parent", "function",
                        "partial", "apply", "sort"])  # fmt: skip


class Compiler(FunctionForms):
    """Compiles one evaluation tree; ``track_depth`` counts every node's depth (jsonata-js's
    ``depth`` option) instead of only function calls."""

    def __init__(self, track_depth: bool = False, builtins: dict[str, Any] | None = None,
                 bound: frozenset[str] = frozenset()) -> None:  # fmt: skip
        self.track = track_depth
        # builtin functions no name in the expression rebinds: resolved here, once
        self.constants = {k: v for k, v in (builtins or {}).items() if k not in bound}

    def compile(self, node: Node) -> Fn:
        fn = self._base(node)
        preds = node.get("predicate")
        if preds:
            filters = [filter_fn(p.expr, self.compile(p.expr)) for p in preds]
            inner = fn

            def filtered(inp: Any, env: Frame) -> Any:
                r = inner(inp, env)
                for f in filters:
                    r = f(r, env)
                return r

            fn = filtered
        if node.type != "path" and node.get("group") is not None:
            group = self._group(node.group)
            inner2 = fn

            def grouped(inp: Any, env: Frame) -> Any:
                return group(inner2(inp, env), env)

            fn = grouped
        if (
            (node.type in _SEQUENCES and not (node.type == "variable" and node.value == ""))
            or preds
            or node.get("group") is not None
            or node.get("keepArray")
        ):
            fn = unwrap(fn, bool(node.get("keepArray")))
        if self.track:
            fn = tracked(fn, node.position)
        return fn

    def _group(self, group: Node) -> Any:
        pairs = [(self.compile(k), self.compile(v)) for k, v in group.lhs]
        return group_fn(pairs, group.position)

    def _base(self, node: Node) -> Fn:
        t = node.type
        if t in ("string", "number", "value"):
            value = node.value
            return lambda inp, env: value
        if t == "regex":
            regex = Regex(node.value[0], node.value[1], node.position)
            return lambda inp, env: regex
        if t == "name":
            key = node.value

            def name(inp: Any, env: Frame) -> Any:
                if inp.__class__ is dict:
                    return inp.get(key, UNDEFINED)
                return lookup(inp, key)

            return name
        if t == "variable":
            return self._variable(node)
        if t == "wildcard":
            return wildcard
        if t == "descendant":
            return descendants
        if t == "parent":
            label = node.slot.label
            return lambda inp, env: env.lookup(label)
        if t == "path":
            return self._path(node)
        if t == "binary":
            return binary_fn(
                node.value, self.compile(node.lhs), self.compile(node.rhs), node.position
            )
        if t == "unary":
            return self._unary(node)
        if t == "condition":
            return self._condition(node)
        if t in ("coalesce", "elvis"):
            return self._coalesce(node)
        if t == "block":
            return self._block(node)
        if t == "bind":
            var = node.lhs.value
            rhs = self.compile(node.rhs)

            def bind(inp: Any, env: Frame) -> Any:
                v = rhs(inp, env)
                env.vars[var] = v
                return v

            return bind
        if t == "function":
            return self._call(node, with_context=False)
        if t == "partial":
            return self._partial(node)
        if t == "lambda":
            return self._lambda(node)
        if t == "apply":
            return self._apply(node)
        if t == "transform":
            return transform_fn(self.compile(node.pattern), self.compile(node.update),
                                self.compile(node.delete) if node.delete is not None else None,
                                node.position)  # fmt: skip
        if t == "sort":  # a sort on its own (not in a path): sort the input
            return sort_step([(d, self.compile(e)) for d, e in node.terms], node.position)
        raise fail("S0206", f"Unknown expression type: {t}", node.position, t)  # pragma: no cover

    def _variable(self, node: Node) -> Fn:
        name = node.value
        if name == "":

            def context(inp: Any, env: Frame) -> Any:
                if inp.__class__ is Seq and inp.outer_wrapper:
                    return inp[0]
                return inp

            return context
        if name in self.constants:
            const = self.constants[name]
            return lambda inp, env: const
        return lambda inp, env: env.lookup(name)

    def _path(self, node: Node) -> Fn:
        steps = []
        for s in node.steps:
            stages = s.get("stages")
            compiled_stages = None
            if stages:
                compiled_stages = stages_fn([
                    ("filter", filter_fn(st.expr, self.compile(st.expr))) if st.type == "filter"
                    else ("index", st.value)
                    for st in stages
                ])  # fmt: skip
            is_sort = s.type == "sort"
            ancestor = s.get("ancestor")
            steps.append({
                "type": s.type,
                "fn": None if is_sort else self.compile(s),
                "sort": sort_step([(d, self.compile(e)) for d, e in s.terms], s.position) if is_sort else None,
                "stages": compiled_stages,
                "tuple": bool(s.get("tuple")),
                "consarray": bool(s.get("consarray")),
                "focus": s.get("focus"),
                "index": s.get("index"),
                "ancestor": ancestor.label if ancestor is not None else None,
            })  # fmt: skip
        group = self._group(node.group) if node.get("group") is not None else None
        general = path_fn(
            steps, bool(node.get("keepSingletonArray")), group, bool(node.get("tuple"))
        )
        simple = all(
            s["type"] == "name" and s["stages"] is None and not s["tuple"] and s["focus"] is None
            and s["index"] is None and s["ancestor"] is None and s["sort"] is None
            and not n.get("keepArray") and n.get("predicate") is None and n.get("group") is None
            for s, n in zip(steps, node.steps, strict=True)
        )  # fmt: skip
        if not simple or group is not None or node.get("keepSingletonArray") or node.get("tuple"):
            return general
        return name_chain([n.value for n in node.steps], general)

    def _unary(self, node: Node) -> Fn:
        if node.value == "-":
            expr = self.compile(node.expression)
            pos = node.position

            def neg(inp: Any, env: Frame) -> Any:
                v = expr(inp, env)
                if v is UNDEFINED:
                    return UNDEFINED
                if v.__class__ is int or v.__class__ is float:
                    return -v
                raise fail("D1002", "Cannot negate a non-numeric value", pos, v)

            return neg
        if node.value == "[":
            items = [
                (self.compile(e), e.type == "unary" and e.value == "[") for e in node.expressions
            ]

            def array(inp: Any, env: Frame) -> Any:
                out = Cons()
                for fn, nested in items:
                    v = fn(inp, env)
                    if v is UNDEFINED:
                        continue
                    if nested or not isinstance(v, list):
                        out.append(v)
                    else:
                        out.extend(v)
                return out

            if node.get("consarray"):
                return array

            def plain(inp: Any, env: Frame) -> Any:
                return list(array(inp, env))

            return plain
        pairs = [(self.compile(k), self.compile(v)) for k, v in node.lhs]
        general = group_fn(pairs, node.position)
        keys = [k.value for k, _ in node.lhs if k.type == "string"]
        if len(keys) != len(node.lhs) or len(set(keys)) != len(keys):
            return general
        values = [(k, v) for k, (_, v) in zip(keys, pairs, strict=True)]

        def literal_keys(inp: Any, env: Frame) -> Any:
            # one context (not a sequence to group): each value over it
            if isinstance(inp, list):
                return general(inp, env)
            out = {}
            for key, value in values:
                v = value(inp, env)
                if v is not UNDEFINED:
                    out[key] = v
            return out

        return literal_keys

    def _condition(self, node: Node) -> Fn:
        cond = self.compile(node.condition)
        then = self.compile(node.then)
        other = self.compile(node.other) if node.other is not None else None

        def run(inp: Any, env: Frame) -> Any:
            if to_boolean(cond(inp, env)) is True:
                return then(inp, env)
            return other(inp, env) if other is not None else UNDEFINED

        return run

    def _coalesce(self, node: Node) -> Fn:
        lhs, rhs = self.compile(node.lhs), self.compile(node.rhs)
        if node.type == "coalesce":

            def coalesce(inp: Any, env: Frame) -> Any:
                v = lhs(inp, env)
                return rhs(inp, env) if v is UNDEFINED else v

            return coalesce

        def elvis(inp: Any, env: Frame) -> Any:
            v = lhs(inp, env)
            return v if to_boolean(v) is True else rhs(inp, env)

        return elvis

    def _block(self, node: Node) -> Fn:
        fns = [self.compile(e) for e in node.expressions]

        def block(inp: Any, env: Frame) -> Any:
            frame = Frame(env)
            r = UNDEFINED
            for fn in fns:
                r = fn(inp, frame)
            return r

        return block
