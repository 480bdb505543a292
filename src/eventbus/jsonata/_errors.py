"""JSONata errors: one class, carrying JSONata's error code (``S0201``, ``T2001``...), the
character position in the expression and the offending token or value."""

from __future__ import annotations

from typing import Any

from eventbus.errors import EventBusError

__all__ = ["JSONataError", "fail"]


class JSONataError(EventBusError, ValueError):
    """A JSONata expression failed to compile or to evaluate.

    Args:
        code: JSONata's error code (``S0xxx`` syntax, ``T`` type, ``D`` dynamic, ``U`` budget).
        message: what went wrong, naming the value and the fix.
        position: 1-based character offset in the expression (0 when unknown).
        token: the token or value involved, when there is one.
    """

    def __init__(self, code: str, message: str, position: int = 0, token: Any = None) -> None:
        super().__init__(code, message, position, token)
        self.code = code
        self.description = message
        self.position = position
        self.token = token
        where = f" at position {position}" if position else ""
        self.message = f"JSONata {code}{where}: {message}"

    def __str__(self) -> str:
        return self.message


def fail(code: str, message: str, position: int = 0, token: Any = None) -> JSONataError:
    """Build a :class:`JSONataError` (``raise fail(...)``)."""
    return JSONataError(code, message, position, token)
