"""The expression languages a step may declare through its ``expressions`` trait, for the
loader's checks: CEL (the default), a model step's output expression, CloudEvents SQL
(``"sql"``) and JSONata (``"jsonata"``)."""

from __future__ import annotations

from eventbus import cel, cesql, jsonata

__all__ = ["EXPRESSION_ERRORS", "check_expression_source", "error_message", "error_position"]

#: What a bad expression raises, in any of the languages.
EXPRESSION_ERRORS: tuple[type[Exception], ...] = (
    cel.CELError,
    cesql.CESQLError,
    jsonata.JSONataError,
)


def check_expression_source(source: str, language: bool | str) -> None:
    """Compile ``source`` in its language (``language``: False for CEL, True for a model's
    output expression, ``"sql"``, ``"jsonata"``).

    Raises:
        cel.CELError, cesql.CESQLError, jsonata.JSONataError: it does not compile.
    """
    if language == "sql":
        cesql.compile(source)
    elif language == "jsonata":
        jsonata.compile(source)
    elif language:
        from eventbus.pipelines.steps._model import check_output_expression

        check_output_expression(source)
    else:
        from eventbus.pipelines._activation import check_identifiers

        check_identifiers(cel.compile(source))


def error_position(exc: Exception) -> tuple[int, int | None]:
    """The column (1-based) and line (None: the first) in the expression of an error."""
    if isinstance(exc, jsonata.JSONataError):
        return exc.position or 1, None
    return getattr(exc, "column", None) or 1, getattr(exc, "line", None)


def error_message(exc: Exception) -> str:
    """The message of an expression error, without its position."""
    return str(getattr(exc, "message", exc))
