"""The compiler's function forms: calls, partial application, lambdas (tail calls become
thunks for the trampoline) and the ``~>`` operator."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from eventbus.jsonata._apply import Composition, Partial, Thunk, apply, hole
from eventbus.jsonata._errors import JSONataError, fail
from eventbus.jsonata._parser import Node
from eventbus.jsonata._paths import Fn
from eventbus.jsonata._values import UNDEFINED, Builtin, Frame, Lambda, is_function

__all__ = ["FunctionForms"]


class FunctionForms:
    """Mixin of :class:`~eventbus.jsonata._compile.Compiler`: compiles the function nodes."""

    constants: dict[str, Any]

    if TYPE_CHECKING:  # the compiler's (mixed in beside); nothing defined here at run time

        def compile(self, node: Node) -> Fn: ...

    def _call(self, node: Node, with_context: bool) -> Callable[..., Any]:
        proc_fn = self.compile(node.procedure)
        arg_fns = [self.compile(a) for a in node.arguments]
        pos = node.position
        proc_node = node.procedure
        forgot = proc_node.steps[0].value if proc_node.type == "path" else None
        builtin = None
        if proc_node.type == "variable" and not proc_node.get("predicate"):
            builtin = self.constants.get(proc_node.value)
        if builtin is not None and builtin.__class__ is Builtin and builtin.signature is not None:
            # a standard-library function no name rebinds: check and call it directly
            validate, impl = builtin.signature.validate, builtin.impl

            def call_builtin(inp: Any, env: Frame, *first: Any) -> Any:
                args = [*first, *[a(inp, env) for a in arg_fns]]
                env.state.charge(1)
                try:
                    return impl(env, *validate(args, inp, pos))
                except JSONataError as exc:
                    if not exc.position:
                        exc.position = pos
                    raise

            return call_builtin

        def call(inp: Any, env: Frame, *first: Any) -> Any:
            proc = proc_fn(inp, env)
            if proc is UNDEFINED and forgot is not None and env.lookup(forgot) is not UNDEFINED:
                msg = f"Attempted to invoke a non-function. Did you mean ${forgot}?"
                raise fail("T1005", msg, pos, forgot)
            args = [*first, *(a(inp, env) for a in arg_fns)]
            return apply(proc, args, inp, env, pos)

        return call

    def _partial(self, node: Node) -> Fn:
        proc_fn = self.compile(node.procedure)
        arg_fns = [
            None if (a.type == "operator" and a.value == "?") else self.compile(a)
            for a in node.arguments
        ]
        pos = node.position
        proc_node = node.procedure
        forgot = proc_node.steps[0].value if proc_node.type == "path" else None

        def partial(inp: Any, env: Frame) -> Any:
            args = [hole() if a is None else a(inp, env) for a in arg_fns]
            proc = proc_fn(inp, env)
            if proc is UNDEFINED and forgot is not None and env.lookup(forgot) is not UNDEFINED:
                msg = f"Attempted to partially apply a non-function. Did you mean ${forgot}?"
                raise fail("T1007", msg, pos, forgot)
            if not is_function(proc):
                raise fail("T1008", "Attempted to partially apply a non-function", pos, proc)
            return Partial(proc, args)

        return partial

    def _lambda(self, node: Node) -> Fn:
        if node.get("thunk"):
            body = node.body
            proc_fn = self.compile(body.procedure)
            arg_fns = [self.compile(a) for a in body.arguments]
            pos = body.position
            return lambda inp, env: Thunk(proc_fn, arg_fns, inp, env, pos)
        params = [a.value for a in node.arguments]
        body_fn = self.compile(node.body)
        sig = node.signature
        pos = node.position
        return lambda inp, env: Lambda(params, body_fn, env, inp, sig, pos)

    def _apply(self, node: Node) -> Fn:
        lhs = self.compile(node.lhs)
        pos = node.position
        if node.rhs.type == "function":
            call = self._call(node.rhs, with_context=True)
            return lambda inp, env: call(inp, env, lhs(inp, env))
        rhs = self.compile(node.rhs)

        def run(inp: Any, env: Frame) -> Any:
            v = lhs(inp, env)
            func = rhs(inp, env)
            if not is_function(func):
                raise fail(
                    "T2006",
                    "The right side of the function application operator ~> must be a function",
                    pos,
                    func,
                )
            if is_function(v):
                return Composition(v, func)
            return apply(func, [v], UNDEFINED, env, pos)

        return run
