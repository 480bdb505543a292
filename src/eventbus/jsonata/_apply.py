"""Calling functions: lambdas (with the tail-call trampoline), natives, partial applications,
regexes and ``~>`` compositions; the budget's depth and step charges live here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventbus.jsonata._errors import fail
from eventbus.jsonata._values import UNDEFINED, Builtin, Frame, Lambda

__all__ = ["Composition", "Partial", "Thunk", "apply", "call"]


class Thunk:
    """A tail call, returned by a lambda body and run by :func:`apply`'s loop."""

    __slots__ = ("args", "env", "inp", "position", "proc")

    def __init__(self, proc: Callable[..., Any], args: list[Any], inp: Any, env: Frame,
                 position: int) -> None:  # fmt: skip
        self.proc = proc
        self.args = args
        self.inp = inp
        self.env = env
        self.position = position


class Partial:
    """``$f(?, 2)``: a function with some arguments bound."""

    __slots__ = ("args", "arity", "proc")

    def __init__(self, proc: Any, args: list[Any]) -> None:
        self.proc = proc
        self.args = args
        self.arity = sum(1 for a in args if a is _HOLE)


class Composition:
    """``$f ~> $g``: a function applying ``$f`` then ``$g``."""

    __slots__ = ("arity", "first", "second")

    def __init__(self, first: Any, second: Any) -> None:
        self.first = first
        self.second = second
        self.arity = 1


_HOLE: Any = object()


def hole() -> Any:
    """The placeholder ``?`` of a partial application."""
    return _HOLE


def _inner(proc: Any, args: list[Any], inp: Any, env: Frame, position: int) -> Any:
    cls = proc.__class__
    if cls is Lambda:
        if proc.signature is not None:
            args = proc.signature.validate(args, inp, position)
        state = env.state
        weight = state.call_weight
        state.depth += weight
        if state.depth > state.max_depth:
            state.depth = 0
            msg = (f"Stack overflow: function calls nested deeper than {state.max_depth} (max_depth); "
                   "check for non-terminating recursion or rewrite it as tail-recursive")  # fmt: skip
            raise fail("U1001", msg, position)
        state.charge(1)
        try:
            frame = Frame(proc.frame)
            params = proc.params
            for i, name in enumerate(params):
                frame.vars[name] = args[i] if i < len(args) else UNDEFINED
            return proc.body(proc.input, frame)
        finally:
            state.depth -= weight
    if cls is Builtin:
        if proc.signature is not None:
            args = proc.signature.validate(args, inp, position)
        env.state.charge(1)
        return proc.impl(env, *args)
    if cls is Partial:
        it = iter(args)
        filled = [next(it, UNDEFINED) if a is _HOLE else a for a in proc.args]
        return apply(proc.proc, filled, inp, env, position)
    if cls is Composition:
        return apply(proc.second, [apply(proc.first, args, inp, env, position)], inp, env, position)
    call_ = getattr(proc, "invoke", None)
    if call_ is not None:
        return call_(env, *args)
    raise fail("T1006", "Attempted to invoke a non-function", position, proc)


def apply(proc: Any, args: list[Any], inp: Any, env: Frame, position: int = 0) -> Any:
    """Call ``proc`` with ``args``; tail calls run in a loop, not on the Python stack."""
    result = _inner(proc, args, inp, env, position)
    while result.__class__ is Thunk:
        t = result
        result = _inner(
            t.proc(t.inp, t.env), [a(t.inp, t.env) for a in t.args], inp, env, t.position
        )
    return result


def call(env: Frame, proc: Any, *args: Any) -> Any:
    """Call a function value from a native function (``$map``'s callback), trimming the
    arguments to what the function declares."""
    arity = max(getattr(proc, "arity", len(args)), 1)
    return apply(proc, list(args[:arity]) if arity < len(args) else list(args), UNDEFINED, env)
