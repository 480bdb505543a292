"""Compiling an expression once and evaluating it per input, within a budget."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from eventbus._internal.recursion import ensure_headroom
from eventbus.jsonata._ast import process
from eventbus.jsonata._compile import Compiler, bound_names
from eventbus.jsonata._errors import JSONataError, fail
from eventbus.jsonata._fast import generate
from eventbus.jsonata._fn_data import DATA_FUNCTIONS
from eventbus.jsonata._fn_format import FORMAT_FUNCTIONS
from eventbus.jsonata._fn_integer import INTEGER_FUNCTIONS
from eventbus.jsonata._fn_strings import STRING_FUNCTIONS
from eventbus.jsonata._parser import parse_raw
from eventbus.jsonata._signature import Signature
from eventbus.jsonata._transform import clone
from eventbus.jsonata._values import UNDEFINED, Builtin, Frame, Seq, State, is_function

__all__ = ["UNSUPPORTED_FUNCTIONS", "Budget", "Expression", "compile"]

#: standard-library functions and forms EventBus does not provide (docs/concepts/jsonata.md)
UNSUPPORTED_FUNCTIONS: tuple[str, ...] = (
    "$eval",
    "$random",
    "$toMillis with words, roman numerals or letters in the picture ([Yw], [YI], [Da])",
    "$fromMillis and $now with a picture or timezone",
    "custom matcher functions as patterns of $match, $contains, $replace, $split",
)

#: the largest expression accepted, in characters
MAX_EXPRESSION_CHARS = 1_000_000


@dataclass(frozen=True)
class Budget:
    """Limits of one evaluation; exceeding one raises :class:`JSONataError` ``U1001``/``U1003``.

    Args:
        max_steps: evaluation steps (items visited by paths and predicates, function calls).
        max_depth: nested function calls (recursion); with ``track_depth`` compiling, nested
            expression evaluations (jsonata-js's ``depth`` option).
        max_length: the longest string or array an evaluation may build.
        max_time_ms: wall-clock time, checked every 1024 steps.
    """

    max_steps: int = 1_000_000
    max_depth: int = 100
    max_length: int = 10_000_000
    max_time_ms: float = 1000.0


_DEFAULT_BUDGET = Budget()
_SCALARS = frozenset([str, int, float, bool, type(None)])


def _headroom() -> None:
    # MAX_NESTING and Budget.max_depth bound the recursion; the limit is shared with the
    # other walkers (eventbus._internal.recursion)
    ensure_headroom()


def _builtins() -> Frame:
    root = Frame.__new__(Frame)
    root.vars = {}
    root.parent = None
    for table in (STRING_FUNCTIONS, DATA_FUNCTIONS, FORMAT_FUNCTIONS, INTEGER_FUNCTIONS):
        for name, (impl, sig) in table.items():
            params = list(inspect.signature(impl).parameters.values())[1:]
            # as JavaScript's Function.length: the parameters before the first optional one
            arity = (
                len([p for p in params if p.kind != p.VAR_POSITIONAL and p.default is p.empty]) or 1
            )
            root.vars[name] = Builtin(name, impl, Signature(sig), arity)
    root.vars["clone"] = Builtin("clone", lambda env, v: UNDEFINED if v is UNDEFINED else clone(v),
                                 Signature("<(oa)-:o>"), 1)  # fmt: skip
    return root


_ROOT = _builtins()


def plain(v: Any) -> Any:
    """A result as plain JSON values (sequences to lists, functions to ``""``)."""
    if v.__class__ is dict and all(
        x.__class__ in _SCALARS and (x.__class__ is not float or x - x == 0.0) for x in v.values()
    ):
        return v
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items() if x is not UNDEFINED}
    if isinstance(v, list):
        return [plain(x) for x in v if x is not UNDEFINED]
    if is_function(v):
        return ""
    if v.__class__ is float and (v - v) != 0.0:
        raise fail("D1001", f"Number out of range: {v} cannot be represented in JSON", 0, v)
    return v


class Expression:
    """A compiled JSONata expression; :meth:`evaluate` is safe to call from many threads.

    Where the expression is in the fast path's subset (:mod:`eventbus.jsonata._fast`),
    ``evaluate`` is the generated function (``fast_path`` is True), with the same results and
    errors; ``Expression.evaluate(expr, ...)`` always runs the closures.
    """

    def __init__(self, source: str, track_depth: bool = False) -> None:
        if len(source) > MAX_EXPRESSION_CHARS:
            msg = f"Expression of {len(source)} characters exceeds the limit of {MAX_EXPRESSION_CHARS}"
            raise fail("U1003", msg)
        self.source = source
        self._track = track_depth
        _headroom()
        try:
            tree = process(parse_raw(source))
            bound = frozenset(bound_names(tree))
            self._fn = Compiler(track_depth, _ROOT.vars, bound).compile(tree)
        except RecursionError as exc:  # pragma: no cover - the parser's nesting limit comes first
            raise fail("U1002", "Expression nested deeper than the compiler allows") from exc
        # the common subset as one generated function (same results, same errors), which
        # shadows the method; the method itself always runs the closures
        fast = None
        if not track_depth and not bound:
            fast = generate(tree, _ROOT.vars, self.evaluate, plain, _DEFAULT_BUDGET)
        #: whether :meth:`evaluate` runs the generated fast path (docs/concepts/jsonata.md)
        self.fast_path = fast is not None
        if fast is not None:
            self.__dict__["evaluate"] = fast

    def __reduce__(self) -> tuple[Any, ...]:
        return (Expression, (self.source, self._track))

    def evaluate(self, data: Any, bindings: dict[str, Any] | None = None,
                 budget: Budget = _DEFAULT_BUDGET) -> Any:  # fmt: skip
        """Evaluate against ``data`` (JSON as Python; ``UNDEFINED`` for no input).

        Returns:
            The result, plain JSON, or :data:`UNDEFINED` when the expression yields nothing.

        Raises:
            JSONataError: a type or dynamic error, or a spent budget (``U1001``, ``U1003``).
        """
        b = budget
        state = State(b.max_steps, b.max_depth, b.max_length, b.max_time_ms)
        state.call_weight = 0 if self._track else 1
        env = Frame(_ROOT, state)
        if bindings:
            env.vars.update(bindings)
        env.vars["$"] = data
        inp = data
        if isinstance(data, list) and not isinstance(data, Seq):
            inp = Seq([data])
            inp.outer_wrapper = True
        try:
            result = self._fn(inp, env)
        except RecursionError as exc:
            msg = (
                "Stack overflow: evaluation nested too deeply; check for non-terminating recursion"
            )
            raise fail("U1001", msg) from exc
        except JSONataError:
            raise
        except (
            TypeError,
            AttributeError,
            KeyError,
            IndexError,
            ValueError,
            ArithmeticError,
        ) as exc:
            # a value of a kind no check above foresaw: that evaluation fails, never its caller
            msg = f"cannot evaluate on this input ({type(exc).__name__}: {exc})"
            raise fail("D1000", msg) from exc
        if isinstance(result, (dict, list)):
            return plain(result)
        if is_function(result):
            return result
        return result


def compile(source: str, track_depth: bool = False) -> Expression:
    """Parse and compile a JSONata expression once.

    Example:
        >>> from eventbus import jsonata
        >>> jsonata.compile("$sum(items.price)").evaluate({"items": [{"price": 2}, {"price": 3}]})
        5

    Raises:
        JSONataError: a syntax error (``S0xxx``), with its position.
    """
    return Expression(source, track_depth)
