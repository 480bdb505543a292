"""CESQL lexer: case-insensitive keywords, ``'``/``"`` strings, integers, identifiers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from eventbus.cesql._errors import CESQLError

__all__ = ["KEYWORDS", "MAX_EXPRESSION_LENGTH", "Token", "position", "tokenize"]

#: Longer expressions are refused before lexing (a filter is a line or a few).
MAX_EXPRESSION_LENGTH: Final = 100_000

KEYWORDS: Final = frozenset({"AND", "OR", "XOR", "NOT", "LIKE", "EXISTS", "IN", "TRUE", "FALSE"})

_TOKEN = re.compile(
    r"(?P<ws>\s+)"
    r"|(?P<int>[0-9]+(?![A-Za-z_]))"
    r"|(?P<word>[A-Za-z0-9_]+)"
    r"|(?P<sq>'(?:\\.|''|[^'\\])*')"
    r'|(?P<dq>"(?:\\.|""|[^"\\])*")'
    r"|(?P<punct><>|!=|<=|>=|[=<>+\-*/%(),])",
    re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class Token:
    """``kind``: INT, STRING, IDENT (value as written), a keyword (upper), punctuation, EOF."""

    kind: str
    value: object
    pos: int
    text: str


def position(source: str, pos: int) -> tuple[int, int]:
    """1-based (line, column) of offset ``pos`` in ``source``."""
    line = source.count("\n", 0, pos) + 1
    return line, pos - (source.rfind("\n", 0, pos) + 1) + 1


def error(message: str, source: str, pos: int, kind: str = "parse") -> CESQLError:
    """A compile error at offset ``pos``."""
    line, col = position(source, pos)
    return CESQLError(message, kind, source, line, col)


def _unquote(text: str) -> str:
    quote = text[0]
    body = text[1:-1]
    # the quote doubled or backslash-escaped is the quote; other backslashes stay as written
    # (LIKE patterns give them their meaning)
    return body.replace(quote + quote, quote).replace("\\" + quote, quote)


def tokenize(source: str) -> list[Token]:
    """The tokens of ``source``, ending with EOF.

    Raises:
        CESQLError: an unknown character or an unterminated string (kind ``parse``).
    """
    if len(source) > MAX_EXPRESSION_LENGTH:
        msg = (
            f"the expression is {len(source):,} characters long; the maximum is "
            f"{MAX_EXPRESSION_LENGTH:,}: split the condition into several filters"
        )
        raise CESQLError(msg, "parse", source[:200], 1, 1)
    out: list[Token] = []
    pos, n = 0, len(source)
    match = _TOKEN.match
    while pos < n:
        m = match(source, pos)
        if m is None:
            c = source[pos]
            if c in "'\"":
                msg = f"unterminated string starting here: add the closing {c}"
            else:
                msg = (
                    f"unexpected character {c!r}; CESQL has the operators = != <> < <= > >= "
                    "+ - * / % and AND OR XOR NOT LIKE IN EXISTS"
                )
            raise error(msg, source, pos)
        group = m.lastgroup
        text = m.group()
        if group == "int":
            out.append(Token("INT", int(text) if len(text) <= 12 else 2**40, pos, text))
        elif group == "word":
            upper = text.upper()
            kind = upper if upper in KEYWORDS else "IDENT"
            out.append(Token(kind, text, pos, text))
        elif group in ("sq", "dq"):
            out.append(Token("STRING", _unquote(text), pos, text))
        elif group == "punct":
            out.append(Token(text, text, pos, text))
        pos = m.end()
    out.append(Token("EOF", None, n, ""))
    return out
