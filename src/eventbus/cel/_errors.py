"""The CEL error type and the internal evaluation error."""

from __future__ import annotations

__all__ = ["CELError", "EvalError", "brief"]


class CELError(ValueError):
    """A CEL expression failed to compile or to evaluate.

    Compile errors (syntax, unknown function, undeclared variable...) carry the
    expression and the 1-based column of the offending token; evaluation errors
    (no such key, no matching overload, overflow, division by zero...) have
    ``column`` set to ``None``.

    Args:
        message: What went wrong, without the position.
        expression: The CEL source, when known.
        column: 1-based column inside ``expression``, for compile errors.

    Example:
        >>> from eventbus import cel
        >>> try:
        ...     cel.compile("1 +")
        ... except cel.CELError as err:
        ...     print(err.column)
        4
    """

    def __init__(
        self, message: str, expression: str | None = None, column: int | None = None
    ) -> None:
        # Every constructor argument goes to super().__init__ so that the error
        # pickles (it crosses Ray actor boundaries).
        super().__init__(message, expression, column)
        self.message = message
        self.expression = expression
        self.column = column

    def __str__(self) -> str:
        if self.column is not None:
            return f"column {self.column}: {self.message}"
        return self.message


class EvalError(Exception):
    """Internal: a CEL evaluation error raised by the runtime helpers."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def brief(value: object, limit: int = 60) -> str:
    """``repr(value)`` shortened for error messages (values may be megabytes of input)."""
    if isinstance(value, str | bytes) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value):,} {unit})"
    text = repr(value)
    return text if len(text) <= limit + 20 else f"{text[:limit]}... ({len(text):,} characters)"
