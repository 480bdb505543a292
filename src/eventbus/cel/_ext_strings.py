"""The CEL strings extension (cel-go ``ext.Strings``), including ``format``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

from eventbus.cel._errors import EvalError
from eventbus.cel._runtime import kind, no_overload
from eventbus.cel._stdlib import format_double, format_duration, format_timestamp

__all__ = [
    "char_at",
    "format_",
    "index_of",
    "join",
    "last_index_of",
    "lower_ascii",
    "quote",
    "replace",
    "reverse",
    "split",
    "substring",
    "trim",
    "upper_ascii",
]

# Unicode White_Space, as Go's unicode.IsSpace (Python's isspace differs).
_WHITESPACE: Final = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER: Final = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _check(op: str, args: tuple[Any, ...], kinds: str) -> None:
    for arg, want in zip(args, kinds, strict=True):
        k = kind(arg)
        if (want == "s" and k != "string") or (want == "i" and k != "int"):
            no_overload(op, *args)


def _range_error(op: str, value: int) -> EvalError:
    return EvalError(f"{op}: index out of range: {value}")


def char_at(s: Any, i: Any) -> str:
    """``s.charAt(i)``: the code point at ``i``; ``''`` at ``size(s)``."""
    _check("charAt", (s, i), "si")
    if not 0 <= i <= len(s):
        raise _range_error("charAt", i)
    return str(s[i : i + 1])


def index_of(s: Any, sub: Any, start: Any = 0) -> int:
    """``s.indexOf(sub[, start])`` in code points; -1 when absent."""
    _check("indexOf", (s, sub, start), "ssi")
    if not 0 <= start <= len(s):
        raise _range_error("indexOf", start)
    return int(s.find(sub, start))


def last_index_of(s: Any, sub: Any, start: Any = None) -> int:
    """``s.lastIndexOf(sub[, start])``: last match beginning at or before ``start``."""
    if start is None:
        _check("lastIndexOf", (s, sub), "ss")
        return int(s.rfind(sub))
    _check("lastIndexOf", (s, sub, start), "ssi")
    if not 0 <= start <= len(s):
        raise _range_error("lastIndexOf", start)
    return int(s.rfind(sub, 0, start + len(sub)))


def lower_ascii(s: Any) -> str:
    """``s.lowerAscii()``."""
    _check("lowerAscii", (s,), "s")
    return str(s).translate(_ASCII_LOWER)


def upper_ascii(s: Any) -> str:
    """``s.upperAscii()``."""
    _check("upperAscii", (s,), "s")
    return str(s).translate(_ASCII_UPPER)


def replace(s: Any, old: Any, new: Any, n: Any = -1) -> str:
    """``s.replace(old, new[, n])``; a negative ``n`` replaces all."""
    _check("replace", (s, old, new, n), "sssi")
    return str(s.replace(old, new, n if n >= 0 else -1))


def split(s: Any, sep: Any, n: Any = -1) -> list[str]:
    """``s.split(sep[, n])`` with Go's ``strings.SplitN`` semantics."""
    _check("split", (s, sep, n), "ssi")
    if n == 0:
        return []
    if sep == "":
        chars = list(s)
        if 0 < n < len(chars):
            return [*chars[: n - 1], "".join(chars[n - 1 :])]
        return chars
    if n < 0:
        return list(s.split(sep))
    return list(s.split(sep, n - 1))


def substring(s: Any, start: Any, end: Any = None) -> str:
    """``s.substring(start[, end])`` in code points."""
    if end is None:
        _check("substring", (s, start), "si")
        end = len(s)
    else:
        _check("substring", (s, start, end), "sii")
    if not 0 <= start <= len(s):
        raise _range_error("substring", start)
    if not 0 <= end <= len(s):
        raise _range_error("substring", end)
    if end < start:
        msg = f"substring: invalid range: start {start} > end {end}"
        raise EvalError(msg)
    return str(s[start:end])


def trim(s: Any) -> str:
    """``s.trim()``: strips Unicode white space."""
    _check("trim", (s,), "s")
    return str(s).strip(_WHITESPACE)


def join(lst: Any, sep: Any = "") -> str:
    """``list.join([sep])`` of a list of strings."""
    if kind(lst) != "list" or kind(sep) != "string":
        no_overload("join", lst, sep)
    for item in lst:
        if kind(item) != "string":
            no_overload("join", lst, sep)
    return str(sep).join(lst)


def reverse(s: Any) -> str:
    """``s.reverse()`` by code points."""
    _check("reverse", (s,), "s")
    return str(s)[::-1]


_QUOTE_ESCAPES: Final = {
    "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
    "\v": "\\v", "\\": "\\\\", '"': '\\"',
}  # fmt: skip


def quote(s: Any) -> str:
    """``strings.quote(s)``: a double-quoted CEL string literal for ``s``."""
    _check("strings.quote", (s,), "s")
    out = ['"']
    for ch in s:
        esc = _QUOTE_ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


# -- format ---------------------------------------------------------------------


Reserve = Callable[[int], None]


def _no_reserve(size: int) -> None:
    pass


def _as_string(value: Any, nested: bool = False, reserve: Reserve = _no_reserve) -> str:
    k = kind(value)
    if k == "string":
        return str(value)
    if k == "bytes":
        return bytes(value).decode("utf-8", errors="replace")
    if k == "null":
        return "null"
    if k == "bool":
        return "true" if value else "false"
    if k in ("int", "uint"):
        return str(int(value))
    if k == "double":
        return _special_float(value) or format_double(value)
    if k == "timestamp":
        return format_timestamp(value)
    if k == "duration":
        return format_duration(value)
    if k == "list":
        parts = [_as_string(v, True, reserve) for v in value]
        reserve(sum(map(len, parts)) + 2 * len(parts))  # before the copy that joins them
        return "[" + ", ".join(parts) + "]"
    if k == "map":
        items = sorted(
            (_as_string(key, True, reserve), _as_string(v, True, reserve))
            for key, v in value.items()
        )
        reserve(sum(len(a) + len(b) + 4 for a, b in items))
        return "{" + ", ".join(f"{key}: {v}" for key, v in items) + "}"
    if k == "type":
        return str(value.name)
    if k in ("ip", "cidr"):
        from eventbus.cel._stdlib import to_string

        return to_string(value)
    no_overload("format %s", value)


def _special_float(x: float) -> str | None:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return None


def _format_one(verb: str, precision: int | None, value: Any, reserve: Reserve) -> str:
    k = kind(value)
    if verb == "s":
        return _as_string(value, False, reserve)
    if verb == "d":
        if k in ("int", "uint"):
            return str(int(value))
        if k == "double" and _special_float(value):
            return str(_special_float(value))
    elif verb in "fe":
        if k in ("int", "uint", "double"):
            f = float(value)
            special = _special_float(f)
            if special:
                return special
            return format(f, f".{6 if precision is None else precision}{verb}")
    elif verb in "boxX":
        if (k in ("int", "uint") and verb != "b") or (k in ("int", "uint", "bool") and verb == "b"):
            spec = {"b": "b", "o": "o", "x": "x", "X": "X"}[verb]
            return format(int(value), spec)
        if verb in "xX" and k in ("string", "bytes"):
            raw = value.encode("utf-8") if k == "string" else bytes(value)
            text = raw.hex()
            return text.upper() if verb == "X" else text
        if verb in "xX" and k == "double" and _special_float(value):
            return str(_special_float(value))
    else:
        msg = f"format: unsupported verb '%{verb}'"
        raise EvalError(msg)
    msg = f"format: '%{verb}' cannot format a value of type {k}"
    raise EvalError(msg)


def format_(template: Any, args: Any, reserve: Reserve = _no_reserve) -> str:
    """``template.format(list)``: printf-like ``%s %d %f %e %b %o %x %X %%``.

    ``reserve`` is told the size of large pieces before they are built (the budget).
    """
    if kind(template) != "string" or kind(args) != "list":
        no_overload("format", template, args)
    out: list[str] = []
    i = 0
    n = len(template)
    arg_i = 0
    while i < n:
        ch = template[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        i += 1
        if i < n and template[i] == "%":
            out.append("%")
            i += 1
            continue
        precision = None
        if i < n and template[i] == ".":
            j = i + 1
            while j < n and template[j].isdigit():
                j += 1
            precision = int(template[i + 1 : j] or "0")
            i = j
        if i >= n:
            raise EvalError("format: unterminated format verb")
        verb = template[i]
        i += 1
        if arg_i >= len(args):
            msg = f"format: index {arg_i} out of range (only {len(args)} arguments)"
            raise EvalError(msg)
        if precision is not None and verb not in "fe":
            msg = f"format: precision not allowed with '%{verb}'"
            raise EvalError(msg)
        if precision is not None:
            reserve(precision)  # '%.100000000f' is 100 MB
        out.append(_format_one(verb, precision, args[arg_i], reserve))
        arg_i += 1
    return "".join(out)
