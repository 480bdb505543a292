"""CESQL values and implicit casts (Boolean, Integer, String), and the LIKE matcher.

Values are Python ``bool``, ``int`` (32-bit range) and ``str``. Attribute values of other
types (a ``datetime`` time, bytes, URIs) are read as their CloudEvents string forms.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, Final

from eventbus.cesql._errors import EvalError, brief

__all__ = [
    "INT_MAX",
    "INT_MIN",
    "ZERO",
    "Like",
    "attribute_value",
    "explicit_bool",
    "to_bool",
    "to_int",
    "to_str",
    "type_of",
    "wrap32",
]

INT_MIN: Final = -(2**31)
INT_MAX: Final = 2**31 - 1
#: The zero value of each type (``any``: an attribute reference, false).
ZERO: Final[dict[str, Any]] = {"bool": False, "int": 0, "str": "", "any": False}
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,10}")
#: Characters of value times pattern a LIKE may scan (pattern pieces with ``_``).
MAX_LIKE_STEPS: Final = 50_000_000


def type_of(v: Any) -> str:
    """``bool``, ``int`` or ``str``."""
    t = type(v)
    return "bool" if t is bool else "int" if t is int else "str"


def wrap32(v: int) -> int:
    """Two's-complement wrap into 32 bits (an overflowed result)."""
    return (v - INT_MIN) % 2**32 + INT_MIN


def attribute_value(v: Any) -> Any:
    """An attribute's value as a CESQL value (non-bool/int/str in its string form)."""
    t = type(v)
    if t is str or t is bool:
        return v
    if t is int:
        return v if INT_MIN <= v <= INT_MAX else str(v)
    if isinstance(v, datetime.datetime):
        return v.isoformat().replace("+00:00", "Z")
    if isinstance(v, bytes):
        import base64

        return base64.b64encode(v).decode("ascii")
    return str(v)


def to_int(v: Any) -> int:
    """Implicit cast to Integer (``INT``): ``true`` is 1; a string must be an integer."""
    t = type(v)
    if t is int:
        return v  # type: ignore[no-any-return]
    if t is bool:
        return 1 if v else 0
    if _INT_TEXT.fullmatch(v):
        n = int(v)
        if INT_MIN <= n <= INT_MAX:
            return n
    msg = f"cannot cast {brief(v)} to Integer: it is not a 32-bit integer"
    raise EvalError("cast", msg, 0)


def to_bool(v: Any) -> bool:
    """Implicit cast to Boolean: a string ``true``/``false`` in any case; an integer is not
    cast implicitly (``BOOL(x)`` does it)."""
    t = type(v)
    if t is bool:
        return v  # type: ignore[no-any-return]
    if t is str:
        low = v.lower()
        if low == "true":
            return True
        if low == "false":
            return False
    hint = "; use BOOL(x) to test an integer for non-zero" if t is int else ""
    msg = f"cannot cast {brief(v)} to Boolean: only 'true' and 'false' are{hint}"
    raise EvalError("cast", msg, False)


def explicit_bool(v: Any) -> bool:
    """``BOOL(x)``: as :func:`to_bool`, and an integer is true when non-zero."""
    if type(v) is int:
        return v != 0
    return to_bool(v)


def to_str(v: Any) -> str:
    """Implicit cast to String (``STRING``)."""
    t = type(v)
    if t is str:
        return v  # type: ignore[no-any-return]
    if t is bool:
        return "true" if v else "false"
    return str(v)


def cast(v: Any, to: str) -> Any:
    """Cast ``v`` to the type named ``to`` (bool, int, str; any: unchanged)."""
    if to == "int":
        return to_int(v)
    if to == "bool":
        return to_bool(v)
    if to == "str":
        return to_str(v)
    return v


class Like:
    """A compiled LIKE pattern, matched in time linear in the value per pattern piece.

    ``%`` splits the pattern into pieces; each piece (literal characters and ``_``) must
    occur in order, the first at the start and the last at the end. Taking each piece's
    leftmost occurrence is enough (no backtracking), so ``'%a%a%a%b'`` on a long string
    costs one scan per piece. Pieces with ``_`` are searched with a regex of fixed-width
    items; their cost (value length times piece length) is budgeted.
    """

    __slots__ = ("anchored_end", "anchored_start", "pattern", "pieces", "width")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        pieces: list[list[str | None]] = [[]]  # None: '_'
        i, n = 0, len(pattern)
        while i < n:
            c = pattern[i]
            if c == "\\" and i + 1 < n and pattern[i + 1] in "%_":
                pieces[-1].append(pattern[i + 1])
                i += 2
                continue
            if c == "%":
                pieces.append([])
            elif c == "_":
                pieces[-1].append(None)
            else:
                pieces[-1].append(c)
            i += 1
        self.anchored_start = True
        self.anchored_end = True
        compiled: list[tuple[Any, int]] = []
        for piece in pieces:
            if None in piece:
                rx = "".join("." if ch is None else re.escape(ch) for ch in piece)
                compiled.append((re.compile(rx, re.DOTALL), len(piece)))
            else:
                compiled.append(("".join(piece), len(piece)))  # type: ignore[arg-type]
        self.pieces = compiled
        self.width = sum(len(p) for p in pieces if None in p)

    def match(self, s: str) -> bool:
        """Whether ``s`` matches the whole pattern."""
        pieces = self.pieces
        if self.width and len(s) * self.width > MAX_LIKE_STEPS:
            msg = (
                f"LIKE {brief(self.pattern)} on a value of {len(s):,} characters exceeds the "
                f"budget of {MAX_LIKE_STEPS:,} steps; use fewer '_' or shorter values"
            )
            raise EvalError("generic", msg, False)
        if len(pieces) == 1:
            p = pieces[0][0]
            return s == p if type(p) is str else p.fullmatch(s) is not None
        (first, flen), (last, llen) = pieces[0], pieces[-1]
        if type(first) is str:
            if not s.startswith(first):
                return False
        elif first.match(s) is None:
            return False
        pos, end = flen, len(s) - llen
        if end < pos:
            return False
        if type(last) is str:
            if not s.endswith(last):
                return False
        elif last.fullmatch(s, end) is None:
            return False
        for p, plen in pieces[1:-1]:
            if type(p) is str:
                k = s.find(p, pos, end)
                if k < 0:
                    return False
                pos = k + plen
            else:
                m = p.search(s, pos, end)
                if m is None:
                    return False
                pos = m.end()
        return True
