"""The CESQL error type (compile and evaluation errors) and its kinds (the TCK's names)."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["KINDS", "CESQLError", "EvalError", "brief"]

#: The error kinds of the CESQL TCK: ``parse`` and ``missingFunction`` at compile time, the
#: others at evaluation time.
KINDS: Final = (
    "parse",
    "math",
    "cast",
    "missingFunction",
    "functionEvaluation",
    "missingAttribute",
    "generic",
)


class CESQLError(ValueError):
    """A CloudEvents SQL expression failed to compile or to evaluate.

    Compile errors carry the expression and the 1-based ``line`` and ``column`` of the
    offending token; evaluation errors have them ``None``. ``kind`` is one of the TCK's
    error kinds (:data:`KINDS`).

    Args:
        message: What went wrong and the fix, without the position.
        kind: ``parse``, ``missingFunction``, ``math``, ``cast``, ``functionEvaluation``,
            ``missingAttribute`` or ``generic``.
        expression: The CESQL source, when known.
        line: 1-based line inside ``expression``, for compile errors.
        column: 1-based column inside that line, for compile errors.

    Example:
        >>> from eventbus import cesql
        >>> try:
        ...     cesql.compile("type = ")
        ... except cesql.CESQLError as err:
        ...     print(err.kind, err.line, err.column)
        parse 1 8
    """

    def __init__(
        self,
        message: str,
        kind: str = "generic",
        expression: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        # every argument goes to super().__init__ so that the error pickles (Ray)
        super().__init__(message, kind, expression, line, column)
        self.message = message
        self.kind = kind
        self.expression = expression
        self.line = line
        self.column = column

    def __str__(self) -> str:
        if self.line is not None:
            return f"line {self.line}, column {self.column}: {self.message}"
        return self.message


class EvalError(CESQLError):
    """An evaluation error as raised by the fast path: a :class:`CESQLError` with no
    position; ``fallback`` is the value the failing operator or function gives with it (the
    spec's "zero value plus an error")."""

    def __init__(self, kind: str, message: str, fallback: Any = None) -> None:
        ValueError.__init__(self, kind, message, fallback)  # all arguments: it pickles
        self.kind = kind
        self.message = message
        self.fallback = fallback
        self.expression = None
        self.line = None
        self.column = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (EvalError, (self.kind, self.message, self.fallback))


def brief(value: object, limit: int = 60) -> str:
    """``repr(value)`` shortened for messages (attribute values may be large)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    return repr(value)
