"""CESQL built-in functions: their signatures (for implicit casts) and implementations.

An implementation takes its arguments already cast to the parameter types and the number of
characters its result may have (the expression's string-growth budget shared out between
its growing calls); it raises :class:`EvalError` with the value the spec gives alongside the
error (``LEFT('abc', -2)`` is ``'abc'`` and a functionEvaluation error).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from eventbus.cesql._errors import EvalError
from eventbus.cesql._values import INT_MAX, INT_MIN, explicit_bool, to_int, to_str

__all__ = ["FUNCTIONS", "GROWING", "Function"]


@dataclass(frozen=True, slots=True)
class Function:
    """A built-in: parameter types (``variadic``: the last repeats), result type, code."""

    params: tuple[str, ...]
    result: str
    impl: Callable[[list[Any], int], Any]
    min_args: int
    max_args: int | None  # None: variadic, the last parameter repeats

    def accepts(self, n: int) -> bool:
        """Whether ``n`` arguments dispatch to this function."""
        return self.min_args <= n and (self.max_args is None or n <= self.max_args)

    def arity_text(self) -> str:
        """``2 arguments``, ``at least 1 argument``, ``2 to 3 arguments``."""
        lo, hi = self.min_args, self.max_args
        word = "argument" if (hi or lo) == 1 else "arguments"
        if hi is None:
            return f"at least {lo} {word}"
        return f"{lo} {word}" if lo == hi else f"{lo} to {hi} {word}"

    def param(self, i: int) -> str:
        """The type of parameter ``i``."""
        return self.params[min(i, len(self.params) - 1)]


def _over(name: str, size: int, limit: int) -> EvalError:
    msg = (
        f"{name} would build a string of {size:,} characters, over this expression's budget "
        f"of {limit:,}; build shorter strings"
    )
    return EvalError("generic", msg, "")


def _concat(args: list[Any], limit: int) -> str:
    size = sum(len(a) for a in args)
    if size > limit:
        raise _over("CONCAT", size, limit)
    return "".join(args)


def _concat_ws(args: list[Any], limit: int) -> str:
    sep, rest = args[0], args[1:]
    size = sum(len(a) for a in rest) + len(sep) * max(len(rest) - 1, 0)
    if size > limit:
        raise _over("CONCAT_WS", size, limit)
    return sep.join(rest)  # type: ignore[no-any-return]


def _case(name: str, method: Callable[[str], str]) -> Callable[[list[Any], int], str]:
    def run(args: list[Any], limit: int) -> str:
        s = args[0]
        if 3 * len(s) > limit and len(s) > limit // 3:  # case mapping grows at most 3x
            out = method(s)
            if len(out) > limit:
                raise _over(name, len(out), limit)
            return out
        return method(s)

    return run


def _left(args: list[Any], limit: int) -> str:
    s, n = args
    if n < 0:
        raise EvalError("functionEvaluation", f"LEFT's length must be >= 0; got {n}", s)
    return s[:n]  # type: ignore[no-any-return]


def _right(args: list[Any], limit: int) -> str:
    s, n = args
    if n < 0:
        raise EvalError("functionEvaluation", f"RIGHT's length must be >= 0; got {n}", s)
    return s[len(s) - n :] if n < len(s) else s  # type: ignore[no-any-return]


def _substring(args: list[Any], limit: int) -> str:
    s, pos = args[0], args[1]
    n = len(s)
    if pos > n or pos < -n:
        msg = f"SUBSTRING's position {pos} is outside a string of {n} characters"
        raise EvalError("functionEvaluation", msg, "")
    if len(args) == 3 and args[2] < 0:
        msg = f"SUBSTRING's length must be >= 0; got {args[2]}"
        raise EvalError("functionEvaluation", msg, "")
    if pos == 0:
        return ""
    start = pos - 1 if pos > 0 else n + pos
    if len(args) == 3:
        return s[start : start + args[2]]  # type: ignore[no-any-return]
    return s[start:]  # type: ignore[no-any-return]


def _abs(args: list[Any], limit: int) -> int:
    x = args[0]
    if x == INT_MIN:
        msg = f"ABS({INT_MIN}) overflows a 32-bit integer; the result is {INT_MAX}"
        raise EvalError("math", msg, INT_MAX)
    return abs(x)  # type: ignore[no-any-return]


def _is_bool(args: list[Any], limit: int) -> bool:
    """Whether ``BOOL(x)`` succeeds (a Boolean, an Integer, 'true'/'false' in any case)."""
    try:
        explicit_bool(args[0])
    except EvalError:
        return False
    return True


def _is_int(args: list[Any], limit: int) -> bool:
    """Whether ``INT(x)`` succeeds (an Integer, a Boolean, a 32-bit integer string)."""
    try:
        to_int(args[0])
    except EvalError:
        return False
    return True


FUNCTIONS: Final[dict[str, Function]] = {
    "ABS": Function(("int",), "int", _abs, 1, 1),
    "LENGTH": Function(("str",), "int", lambda a, _: len(a[0]), 1, 1),
    "CONCAT": Function(("str",), "str", _concat, 0, None),
    "CONCAT_WS": Function(("str", "str"), "str", _concat_ws, 1, None),
    "LOWER": Function(("str",), "str", _case("LOWER", str.lower), 1, 1),
    "UPPER": Function(("str",), "str", _case("UPPER", str.upper), 1, 1),
    "TRIM": Function(("str",), "str", lambda a, _: a[0].strip(), 1, 1),
    "LEFT": Function(("str", "int"), "str", _left, 2, 2),
    "RIGHT": Function(("str", "int"), "str", _right, 2, 2),
    "SUBSTRING": Function(("str", "int", "int"), "str", _substring, 2, 3),
    "IS_BOOL": Function(("any",), "bool", _is_bool, 1, 1),
    "IS_INT": Function(("any",), "bool", _is_int, 1, 1),
    "BOOL": Function(("any",), "bool", lambda a, _: explicit_bool(a[0]), 1, 1),
    "INT": Function(("any",), "int", lambda a, _: to_int(a[0]), 1, 1),
    "STRING": Function(("any",), "str", lambda a, _: to_str(a[0]), 1, 1),
}
#: Functions whose result can be longer than their arguments: they share the budget.
GROWING: Final = frozenset({"CONCAT", "CONCAT_WS", "LOWER", "UPPER"})
