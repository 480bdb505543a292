"""``compile()`` and ``Program``: parse once, generate Python, evaluate fast."""

from __future__ import annotations

import builtins
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any

from eventbus.cel._budget import (
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_MAX_OUTPUT_SIZE,
    Budget,
    BudgetError,
)
from eventbus.cel._codegen import Generator, needs_budget
from eventbus.cel._errors import CELError, EvalError
from eventbus.cel._parser import parse

__all__ = ["Program", "compile"]

_TEMPLATE = """\
def _fast(v, type=type, str=str, bool=bool, float=float, int=int):
    try:
{prologue}        return {fast}
    except _BudgetError as exc:
        raise _CELError(exc.message) from None
    except Exception:
        pass
    return _slow(v)

def _slow(v):
    try:
{slow_prologue}        return {slow}
    except _EvalError as exc:
        raise _CELError(exc.message) from None
    except _CELError:
        raise
    except RecursionError:
        raise _CELError("expression evaluation exceeded the recursion limit") from None
    except Exception as exc:
        raise _CELError(_describe(exc)) from None
"""


def _describe(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"no such key: {exc.args[0]!r}" if exc.args else "no such key"
    if isinstance(exc, ZeroDivisionError):
        return "division by zero"
    return f"evaluation error: {type(exc).__name__}: {exc}"


def _build(
    source: str, declared: frozenset[str] | None, max_iterations: int, max_output_size: int
) -> tuple[Callable[[Mapping[str, Any]], Any], frozenset[str]]:
    tree = parse(source)
    namespace: dict[str, Any] = {
        "_EvalError": EvalError,
        "_BudgetError": BudgetError,
        "_CELError": CELError,
        "_describe": _describe,
        "_Budget": Budget,
        "_max_iterations": max_iterations,
        "_max_output_size": max_output_size,
    }
    budget = needs_budget(tree)
    fast = Generator(source, declared, namespace, fast=True, budget=budget)
    slow = Generator(source, declared, namespace, fast=False, budget=budget)
    slow._counter = 10_000_000  # keep temporaries of both paths distinct
    try:
        fast_code = fast.expression(tree)
        slow_code = slow.expression(tree)
    except RecursionError:
        # The parser bounds nesting; this is for callers that already used most of the stack.
        msg = "expression is too deeply nested to compile (Python recursion limit)"
        raise CELError(msg, source, 1) from None
    start = ["_b = _Budget(_max_iterations, _max_output_size)"] if budget else []
    prologue = "".join(f"        {line}\n" for line in [*start, *fast.prologue()])
    slow_prologue = "".join(f"        {line}\n" for line in start)
    text = _TEMPLATE.format(
        fast=fast_code, slow=slow_code, prologue=prologue, slow_prologue=slow_prologue
    )
    try:
        with warnings.catch_warnings():
            # e.g. "'NoneType' object is not subscriptable" for `null.a`: that is
            # a CEL run-time error, not something to warn about at compile time.
            warnings.simplefilter("ignore", SyntaxWarning)
            code = builtins.compile(text, "<cel>", "exec")
    except (SyntaxError, RecursionError, MemoryError) as exc:
        msg = f"expression is too complex to compile: {exc}"
        raise CELError(msg, source, 1) from None
    exec(code, namespace)
    return namespace["_fast"], frozenset(fast.refs | slow.refs)


class Program:
    """A compiled CEL expression.

    Create it with :func:`eventbus.cel.compile`. It holds no parse tree:
    evaluation runs generated Python code. Programs pickle (they are rebuilt
    from ``source`` and the declared variables).

    Attributes:
        source: The CEL source text.
        variables: The top-level identifiers the expression references.

    Example:
        >>> from eventbus import cel
        >>> prog = cel.compile("data.amount > 100")
        >>> sorted(prog.variables)
        ['data']
        >>> prog.evaluate({"data": {"amount": 150}})
        True
    """

    source: str
    variables: frozenset[str]

    def __init__(
        self,
        source: str,
        *,
        variables: Collection[str] | None = None,
        max_iterations: int = DEFAULT_MAX_ITERATIONS,
        max_output_size: int = DEFAULT_MAX_OUTPUT_SIZE,
    ) -> None:
        declared = None if variables is None else frozenset(variables)
        if declared is not None and isinstance(variables, str):
            msg = "variables must be a collection of names, not a string"
            raise TypeError(msg)
        if not isinstance(source, str):
            msg = f"a CEL expression must be a str; got {type(source).__name__}"
            raise TypeError(msg)
        for name, limit in (
            ("max_iterations", max_iterations),
            ("max_output_size", max_output_size),
        ):
            if type(limit) is not int or limit < 0:
                msg = f"{name} must be a non-negative int; got {limit!r}"
                raise ValueError(msg)
        fn, refs = _build(source, declared, max_iterations, max_output_size)
        self.source = source
        self.variables = refs
        self.max_iterations = max_iterations
        self.max_output_size = max_output_size
        self._declared = declared
        self._fn = fn
        # The generated function itself becomes the instance's `evaluate`, so a call costs
        # one Python call per event rather than two (the class method below delegates).
        self.evaluate = fn  # type: ignore[method-assign,assignment]

    def evaluate(self, variables: Mapping[str, object]) -> object:
        """Evaluate the expression against top-level ``variables``.

        Args:
            variables: Values of the top-level identifiers (JSON-like values,
                ``cel.UInt``, ``datetime`` for timestamps, ``timedelta`` for
                durations).

        Returns:
            The CEL value: bool, int, ``UInt``, float, str, bytes, None, list,
            dict, ``datetime.datetime`` or ``datetime.timedelta``.

        Raises:
            CELError: On any evaluation error (no such key, no matching
                overload, overflow, division by zero, undeclared reference,
                over budget).
        """
        return self._fn(variables)

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.source, self._declared, self.max_iterations, self.max_output_size)
        return (_rebuild, args)

    def __repr__(self) -> str:
        return f"Program({self.source!r})"


def _rebuild(
    source: str,
    declared: frozenset[str] | None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    max_output_size: int = DEFAULT_MAX_OUTPUT_SIZE,
) -> Program:
    return Program(
        source,
        variables=declared,
        max_iterations=max_iterations,
        max_output_size=max_output_size,
    )


def compile(
    source: str,
    *,
    variables: Collection[str] | None = None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    max_output_size: int = DEFAULT_MAX_OUTPUT_SIZE,
) -> Program:
    """Compile a CEL expression.

    Every evaluation runs under a budget, checked only where values can grow: an
    evaluation that iterates or produces more fails with ``CELError`` (that evaluation
    only; ``||``, ``&&`` and ``exists`` do not absorb it).

    Args:
        source: The CEL expression (at most 100,000 characters).
        variables: The declared top-level identifiers. When given, a reference
            to any other identifier is a compile error (with a "did you mean"
            hint); when None, unknown identifiers fail at evaluation time.
        max_iterations: Comprehension iterations per evaluation (a comprehension is
            charged the size of its range when it starts; nested ones multiply).
        max_output_size: Characters of strings, bytes of bytes and elements of lists
            and maps that one evaluation may build by concatenation, string functions,
            ``join``, ``replace`` and ``format``.

    Returns:
        The compiled program.

    Raises:
        CELError: On a syntax error, an unknown function or macro, a wrong
            number of arguments, a bad literal, a regular expression that is not
            RE2 syntax, or an undeclared identifier.

    Example:
        >>> from eventbus import cel
        >>> prog = cel.compile("type == 'payment.created' && data.amount > 100")
        >>> prog.evaluate({"type": "payment.created", "data": {"amount": 150}})
        True
        >>> big = cel.compile("xs.map(x, s).join('')", max_output_size=1000)
        >>> big.evaluate({"xs": list(range(100)), "s": "0123456789!"})
        Traceback (most recent call last):
        ...
        eventbus.cel._errors.CELError: CEL evaluation exceeded its budget of 1,000 characters, bytes or elements produced (reached 1,100); build smaller strings and lists, or raise max_output_size in cel.compile()
    """
    return Program(
        source,
        variables=variables,
        max_iterations=max_iterations,
        max_output_size=max_output_size,
    )
