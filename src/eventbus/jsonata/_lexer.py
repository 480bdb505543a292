"""JSONata tokenizer. The parser pulls tokens one at a time and says whether an operand or
an operator is expected, because ``/`` starts a regex only where an operand may start."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from eventbus.jsonata._errors import fail

__all__ = ["OPERATORS", "Lexer", "Token"]

#: operator -> left binding power (jsonata-js ``parser.js``)
OPERATORS: dict[str, int] = {
    ".": 75, "[": 80, "]": 0, "{": 70, "}": 0, "(": 80, ")": 0, ",": 0, "@": 80, "#": 80,
    ";": 80, ":": 80, "?": 20, "+": 50, "-": 50, "*": 60, "/": 60, "%": 60, "|": 20, "=": 40,
    "<": 40, ">": 40, "^": 40, "**": 60, "..": 20, ":=": 10, "!=": 40, "<=": 40, ">=": 40,
    "~>": 40, "?:": 40, "??": 40, "and": 30, "or": 25, "in": 40, "&": 50, "!": 0, "~": 0,
}  # fmt: skip

_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([Ee][-+]?[0-9]+)?")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_NAME_END = frozenset(" \t\n\r\v\f") | frozenset(k for k in OPERATORS if len(k) == 1)


class Token(NamedTuple):
    """One token: its kind, value and the position just after it (1-based, as jsonata-js)."""

    type: str
    value: Any
    position: int


class Lexer:
    """Tokens of one expression, pulled by :meth:`next`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        self.length = len(path)

    def _regex(self) -> Token:
        path, start = self.path, self.pos
        depth = 0
        in_class = False
        while self.pos < self.length:
            ch = path[self.pos]
            if ch == "/" and depth == 0 and not in_class and path[self.pos - 1] != "\\":
                pattern = path[start : self.pos]
                if pattern == "":
                    raise fail("S0301", "Empty regular expressions are not allowed", self.pos)
                self.pos += 1
                flags_start = self.pos
                while self.pos < self.length and path[self.pos] in "im":
                    self.pos += 1
                flags = path[flags_start : self.pos] + "g"
                return Token("regex", (pattern, flags), self.pos)
            if ch in "([{" and path[self.pos - 1] != "\\":
                depth += 1
            elif ch in ")]}" and path[self.pos - 1] != "\\":
                depth -= 1
            self.pos += 1
        raise fail("S0302", "No terminating / in regular expression", self.pos)

    def next(self, infix: bool) -> Token | None:
        """The next token; ``infix`` is True where an operator is expected."""
        path = self.path
        while True:
            if self.pos >= self.length:
                return None
            ch = path[self.pos]
            if ch in " \t\n\r\v\f":
                self.pos += 1
                continue
            if ch == "/" and path.startswith("/*", self.pos):
                end = path.find("*/", self.pos + 2)
                if end < 0:
                    raise fail("S0106", "Comment has no closing tag", self.pos + 1)
                self.pos = end + 2
                continue
            break
        if not infix and ch == "/":
            self.pos += 1
            return self._regex()
        two = path[self.pos : self.pos + 2]
        if two in ("..", ":=", "!=", ">=", "<=", "**", "~>", "?:", "??"):
            self.pos += 2
            return Token("operator", two, self.pos)
        if ch in OPERATORS:
            self.pos += 1
            return Token("operator", ch, self.pos)
        if ch in "\"'":
            return self._string(ch)
        m = _NUMBER.match(path, self.pos)
        if m is not None and ch != "-":
            text = m.group(0)
            value: Any = float(text) if any(c in text for c in ".eE") else int(text)
            if isinstance(value, float) and (
                value != value or value in (float("inf"), -float("inf"))
            ):
                raise fail("S0102", f"Number out of range: {text}", self.pos, text)
            self.pos = m.end()
            return Token("number", value, self.pos)
        if ch == "`":
            end = path.find("`", self.pos + 1)
            if end < 0:
                raise fail(
                    "S0105",
                    "Quoted property name must be terminated with a backquote (`)",
                    self.pos + 1,
                )
            name = path[self.pos + 1 : end]
            self.pos = end + 1
            return Token("name", name, self.pos)
        i = self.pos
        while i < self.length and path[i] not in _NAME_END:
            i += 1
        name = path[self.pos : i]
        self.pos = i
        if name[:1] == "$":
            return Token("variable", name[1:], self.pos)
        if name in ("and", "or", "in"):
            return Token("operator", name, self.pos)
        if name == "true":
            return Token("value", True, self.pos)
        if name == "false":
            return Token("value", False, self.pos)
        if name == "null":
            return Token("value", None, self.pos)
        if name == "":  # pragma: no cover - every character is a token start
            raise fail("S0204", f"Unknown character {ch!r}", self.pos, ch)
        return Token("name", name, self.pos)

    def _string(self, quote: str) -> Token:
        path = self.path
        i = self.pos + 1
        out: list[str] = []
        while i < self.length:
            ch = path[i]
            if ch == "\\":
                i += 1
                esc = path[i : i + 1]
                if esc in _ESCAPES:
                    out.append(_ESCAPES[esc])
                elif esc == "u":
                    code = path[i + 1 : i + 5]
                    if not re.fullmatch(r"[0-9a-fA-F]{4}", code):
                        raise fail(
                            "S0104", "The escape sequence \\u must be followed by 4 hex digits", i
                        )
                    out.append(chr(int(code, 16)))
                    i += 4
                else:
                    raise fail("S0103", f"Unsupported escape sequence: \\{esc}", i, esc)
            elif ch == quote:
                self.pos = i + 1
                text = "".join(out)
                if any("\ud800" <= c <= "\udfff" for c in text):  # join surrogate pairs
                    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")
                return Token("string", text, self.pos)
            else:
                out.append(ch)
            i += 1
        raise fail("S0101", "String literal must be terminated by a matching quote", self.pos + 1)
