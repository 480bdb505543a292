"""CEL lexer: source text to tokens, with string and number literal decoding."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from eventbus.cel._errors import CELError

__all__ = ["RESERVED", "Token", "tokenize"]

# Words that cannot be identifiers (they may still be field selectors and
# receiver function names, as in `{'if': 1}.if` and `a.while()`).
RESERVED: Final = frozenset(
    {
        "as", "break", "const", "continue", "else", "false", "for", "function", "if",
        "import", "in", "let", "loop", "package", "namespace", "null", "return",
        "true", "var", "void", "while",
    }
)  # fmt: skip

_MAX_INT: Final = 2**63
_MAX_UINT: Final = 2**64
_DIGITS: Final = frozenset("0123456789")
# Longer literals are out of range whatever their digits (2**64 has 20 decimal, 17 hex
# digits); Python's int() also refuses strings of over 4,300 digits.
_MAX_DECIMAL_DIGITS: Final = 20
_MAX_HEX_DIGITS: Final = 17

_PUNCT: Final = (
    "==", "!=", "<=", ">=", "&&", "||", ".?", "[?",
    "<", ">", "!", "+", "-", "*", "/", "%", "?", ":", ".", ",", "[", "]", "(", ")", "{", "}", "=",
)  # fmt: skip

# Longest first, as listed in _PUNCT: one regex match instead of a loop over prefixes.
_PUNCT_RE = re.compile("|".join(re.escape(p) for p in _PUNCT))
_WS = re.compile(r"(?:[ \t\n\r\f]+|//[^\n]*)+")
_IDENT = re.compile(r"[_a-zA-Z][_a-zA-Z0-9]*")
_NUMBER = re.compile(
    r"(?P<hex>0[xX][0-9a-fA-F]+)(?P<hu>[uU])?"
    r"|(?P<float>(?:[0-9]*\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+))"
    r"|(?P<int>[0-9]+)(?P<u>[uU])?"
)
_STRING_START = re.compile(r"(?P<prefix>[rRbB]{0,2})(?P<quote>'''|\"\"\"|'|\")")
_SIMPLE_ESCAPES: Final = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", "?": "?", '"': '"', "'": "'", "`": "`",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Token:
    """One token: ``kind`` is a punctuation string or INT/UINT/FLOAT/STRING/BYTES/IDENT/EOF."""

    kind: str
    value: object
    pos: int


def _error(message: str, source: str, pos: int) -> CELError:
    return CELError(message, source, pos + 1)


def _decode_string(body: str, raw: bool, is_bytes: bool, source: str, start: int) -> object:
    """Decode the body of a string or bytes literal (escape sequences)."""
    if raw:
        return body.encode("utf-8") if is_bytes else body
    out: list[bytes] = []  # bytes chunks or str chunks
    chunks: list[str] = []
    i = 0
    n = len(body)

    def flush() -> None:
        if chunks:
            out.append("".join(chunks).encode("utf-8"))
            chunks.clear()

    while i < n:
        c = body[i]
        if c != "\\":
            chunks.append(c)
            i += 1
            continue
        if i + 1 >= n:
            raise _error("invalid escape sequence at end of string", source, start + i)
        e = body[i + 1]
        if e in _SIMPLE_ESCAPES:
            chunks.append(_SIMPLE_ESCAPES[e])
            i += 2
        elif e in "xX":
            digits = body[i + 2 : i + 4]
            if len(digits) != 2 or not _is_hex(digits):
                raise _error("invalid \\x escape sequence", source, start + i)
            code = int(digits, 16)
            if is_bytes:
                flush()
                out.append(bytes([code]))
            else:
                chunks.append(chr(code))
            i += 4
        elif e in "uU":
            width = 4 if e == "u" else 8
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not _is_hex(digits):
                raise _error(f"invalid \\{e} escape sequence", source, start + i)
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise _error(f"invalid unicode code point in \\{e} escape", source, start + i)
            if is_bytes:
                raise _error(f"\\{e} escape not allowed in bytes literal", source, start + i)
            chunks.append(chr(code))
            i += 2 + width
        elif e in "0123":
            digits = body[i + 1 : i + 4]
            if len(digits) != 3 or any(d not in "01234567" for d in digits):
                raise _error("invalid octal escape sequence", source, start + i)
            code = int(digits, 8)
            if is_bytes:
                flush()
                out.append(bytes([code]))
            else:
                chunks.append(chr(code))
            i += 4
        else:
            raise _error(f"invalid escape sequence '\\{e}'", source, start + i)
    if not is_bytes:
        return "".join(chunks)
    flush()
    return b"".join(out)


def _is_hex(text: str) -> bool:
    return all(ch in "0123456789abcdefABCDEF" for ch in text)


def tokenize(source: str) -> list[Token]:
    """Split ``source`` into tokens, ending with an EOF token.

    Raises:
        CELError: On an unknown character, a bad literal or an out-of-range integer.
    """
    tokens: list[Token] = []
    pos = 0
    n = len(source)
    while True:
        m = _WS.match(source, pos)
        if m:
            pos = m.end()
        if pos >= n:
            tokens.append(Token("EOF", None, pos))
            return tokens
        c = source[pos]
        sm = _STRING_START.match(source, pos) if c in "rRbB'\"" else None
        if sm and (c in "'\"" or _valid_prefix(sm.group("prefix"))):
            pos = _lex_string(source, pos, sm, tokens)
            continue
        # ASCII digits only: str.isdigit() is also true of '٣' or '１', which no CEL number has.
        if c in _DIGITS or (c == "." and pos + 1 < n and source[pos + 1] in _DIGITS):
            pos = _lex_number(source, pos, tokens)
            continue
        if c == "_" or (c.isascii() and c.isalpha()):
            m = _IDENT.match(source, pos)
            assert m is not None
            tokens.append(Token("IDENT", m.group(), pos))
            pos = m.end()
            continue
        if c == "`":
            end = source.find("`", pos + 1)
            if end < 0:
                raise _error("unterminated quoted identifier", source, pos)
            name = source[pos + 1 : end]
            if not name or not re.fullmatch(r"[_a-zA-Z0-9.\-/ ]+", name):
                raise _error(f"invalid quoted identifier `{name}`", source, pos)
            tokens.append(Token("QIDENT", name, pos))
            pos = end + 1
            continue
        pm = _PUNCT_RE.match(source, pos)
        if pm is None:
            raise _error(f"unexpected character {c!r}", source, pos)
        p = pm.group()
        if p == "=":
            raise _error("unexpected character '='", source, pos)
        tokens.append(Token(p, p, pos))
        pos += len(p)


def _valid_prefix(prefix: str) -> bool:
    low = prefix.lower()
    return low in ("", "r", "b", "rb", "br")


def _lex_string(source: str, pos: int, sm: re.Match[str], tokens: list[Token]) -> int:
    prefix = sm.group("prefix").lower()
    quote = sm.group("quote")
    raw = "r" in prefix
    is_bytes = "b" in prefix
    body_start = sm.end()
    i = body_start
    n = len(source)
    while True:
        if i >= n:
            raise _error("unterminated string literal", source, pos)
        ch = source[i]
        if source.startswith(quote, i):
            break
        if ch == "\\":
            i += 2
            continue
        if ch in "\r\n" and len(quote) == 1:
            raise _error("newline in string literal", source, i)
        i += 1
    body = source[body_start:i]
    value = _decode_string(body, raw, is_bytes, source, body_start)
    tokens.append(Token("BYTES" if is_bytes else "STRING", value, pos))
    return i + len(quote)


def _lex_number(source: str, pos: int, tokens: list[Token]) -> int:
    m = _NUMBER.match(source, pos)
    if m is None:  # unreachable: the caller saw an ASCII digit (or '.' and a digit)
        raise _error("invalid number literal", source, pos)
    end = m.end()
    if end < len(source) and (source[end] == "_" or source[end].isalnum()):
        raise _error(f"invalid number literal {source[pos : end + 1]!r}", source, pos)
    if m.group("float") is not None:
        tokens.append(Token("FLOAT", float(m.group("float")), pos))
        return end
    if m.group("hex") is not None:
        digits = m.group("hex")[2:].lstrip("0")
        value = int(digits, 16) if len(digits) <= _MAX_HEX_DIGITS else _MAX_UINT
        unsigned = m.group("hu") is not None
    else:
        digits = m.group("int").lstrip("0")
        value = int(digits or "0") if len(digits) <= _MAX_DECIMAL_DIGITS else _MAX_UINT
        unsigned = m.group("u") is not None
    if unsigned:
        if value >= _MAX_UINT:
            raise _error("uint literal out of range", source, pos)
        tokens.append(Token("UINT", value, pos))
    else:
        # The range check needs the sign; the parser applies it (see Parser._unary).
        if value > _MAX_INT:
            raise _error("int literal out of range", source, pos)
        tokens.append(Token("INT", value, pos))
    return end
