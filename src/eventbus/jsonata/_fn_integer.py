"""``$formatInteger`` and ``$parseInteger``: XPath F&O 3.1 ``format-integer`` pictures as
jsonata-js reads them. A picture is a primary token and, after the last ``;``, a modifier
(``o``: ordinal). The token is ``A``/``a`` (letters, as spreadsheet columns: 1 A, 27 AA),
``I``/``i`` (roman numerals), ``W``/``w``/``Ww`` (English words), or a decimal-digit pattern:
mandatory digits of one Unicode digit family (``0``, ``٠``, ``０`` ...), optional digits ``#``
and grouping separators (any other character), repeated across the number where they are
one character at regular intervals. Anything else is a numbering sequence: ``D3130``."""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from eventbus.jsonata._errors import fail
from eventbus.jsonata._values import UNDEFINED, Frame

__all__ = ["INTEGER_FUNCTIONS"]

U = UNDEFINED
_SMALL = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]  # fmt: skip
_SMALL_ORD = ["zeroth", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth", "eighteenth", "nineteenth"]  # fmt: skip
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ("thousand", "million", "billion", "trillion")  # beyond: "thousand trillion" ...
_ROMAN = ((1000, "m"), (900, "cm"), (500, "d"), (400, "cd"), (100, "c"), (90, "xc"),
          (50, "l"), (40, "xl"), (10, "x"), (9, "ix"), (5, "v"), (4, "iv"), (1, "i"))  # fmt: skip
_ROMAN_VALUES = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}
#: the most mandatory digits of a picture (its padding)
MAX_DIGITS = 10_000


@dataclass
class _Picture:
    kind: str  # decimal, letters, roman, words
    case: str = "lower"  # lower, upper, title
    ordinal: bool = False
    zero: int = 0x30  # the digit family's zero (code point)
    mandatory: int = 0
    every: int = 0  # a regular grouping: a separator every ``every`` digits
    separators: list[tuple[int, str]] = field(default_factory=list)  # (digits to its right, char)


def _family_zero(ch: str) -> int | None:
    value = unicodedata.decimal(ch, None)
    return None if value is None else ord(ch) - value


def _regular(separators: list[tuple[int, str]]) -> int:
    """The interval of a regular grouping (one character, at every multiple of it), else 0."""
    if not separators or len({c for _, c in separators}) != 1:
        return 0
    positions = {p for p, _ in separators}
    step = 0
    for p in positions:
        step = math.gcd(step, p)
    return step if all(step * k in positions for k in range(1, len(positions) + 1)) else 0


def _analyse(picture: str) -> _Picture:
    token, semicolon, modifier = picture.rpartition(";")
    if not semicolon:
        token, modifier = picture, ""
    ordinal = modifier.startswith("o")
    named = {"A": ("letters", "upper"), "a": ("letters", "lower"), "I": ("roman", "upper"),
             "i": ("roman", "lower"), "W": ("words", "upper"), "w": ("words", "lower"),
             "Ww": ("words", "title")}  # fmt: skip
    if token in named:
        kind, case = named[token]
        return _Picture(kind, case, ordinal)
    pic = _Picture("decimal", ordinal=ordinal)
    zero: int | None = None
    position = 0  # digit signs to the right so far
    for ch in reversed(token):
        family = _family_zero(ch)
        if family is not None:
            if zero is not None and family != zero:
                raise fail("D3131", "A decimal-digit pattern mixes digits of different families", 0, picture)  # fmt: skip
            zero = family
            pic.mandatory += 1
            position += 1
        elif ch == "#":
            position += 1
        else:
            pic.separators.append((position, ch))
    if zero is None:
        raise fail("D3130", f"The picture {picture!r} is not a supported format (no digit)", 0, picture)  # fmt: skip
    pic.zero = zero
    pic.every = _regular(pic.separators)
    return pic


def _words(n: float, ordinal: bool) -> str:
    """English words (lower case, ``and`` after hundreds and before a last small part)."""

    def say(num: float, after: bool, ordinal: bool) -> str:
        if num < 20:
            word = _SMALL_ORD[int(num)] if ordinal else _SMALL[int(num)]
            return (" and " if after else "") + word
        if num < 100:
            tens, unit = divmod(int(num), 10)
            word = (" and " if after else "") + _TENS[tens - 2]
            if unit:
                return word + "-" + say(unit, False, ordinal)
            return word[:-1] + "ieth" if ordinal else word
        if num < 1000:
            hundreds, below = divmod(int(num), 100)
            word = (", " if after else "") + _SMALL[hundreds] + " hundred"
            if below:
                return word + say(below, True, ordinal)
            return word + "th" if ordinal else word
        scale = min(int(math.log10(num) // 3), len(_SCALES))
        head: float
        rest: float
        if isinstance(num, int):  # exact below 2**53; above, JavaScript's float arithmetic
            head, rest = divmod(int(num), 10 ** (scale * 3))
        else:
            head = float(math.floor(num / 10.0 ** (scale * 3)))
            rest = num - head * 10.0 ** (scale * 3)
        word = (", " if after else "") + say(head, False, False) + " " + _SCALES[scale - 1]
        if rest > 0:
            return word + say(rest, True, ordinal)
        return word + "th" if ordinal else word

    return say(n, False, ordinal)


def _letters(n: int, upper: bool) -> str:
    out = []
    while n > 0:
        n, r = divmod(n - 1, 26)
        out.append(chr(r + (65 if upper else 97)))
    return "".join(reversed(out))


def _roman(n: int) -> str:
    out = []
    for value, numeral in _ROMAN:
        count, n = divmod(n, value)
        out.append(numeral * count)
    return "".join(out)


def _decimal(n: int, pic: _Picture) -> str:
    digits = str(n).rjust(pic.mandatory, "0")
    if pic.zero != 0x30:
        digits = "".join(chr(pic.zero + ord(d) - 0x30) for d in digits)
    if pic.every:
        sep = pic.separators[0][1]
        first = len(digits) % pic.every or pic.every
        parts = [digits[:first]] + [
            digits[i : i + pic.every] for i in range(first, len(digits), pic.every)
        ]
        digits = sep.join(parts)
    else:
        for position, sep in sorted(pic.separators, reverse=True):  # leftmost first
            if 0 < position < len(digits):
                cut = len(digits) - position
                digits = digits[:cut] + sep + digits[cut:]
    if pic.ordinal:
        suffix = {"1": "st", "2": "nd", "3": "rd"}.get(digits[-1], "th")
        if len(digits) > 1 and digits[-2] == "1":
            suffix = "th"
        digits += suffix
    return digits


def _format_integer(env: Frame, value: Any, picture: str) -> Any:
    if value is U:
        return U
    pic = _analyse(picture)
    if pic.mandatory > MAX_DIGITS:  # the padding: a bound on the output
        msg = f"A picture of {pic.mandatory} digits exceeds the output budget ({MAX_DIGITS})"
        raise fail("U1003", msg, 0, picture)
    floor = math.floor(value)
    negative = floor < 0
    n = -floor if negative else floor
    if pic.kind == "words":
        text = _words(n if n < 2**53 else float(n), pic.ordinal)
        text = text.upper() if pic.case == "upper" else text
        if pic.case == "title":
            text = " ".join(w if w == "and" else "-".join(p.capitalize() for p in w.split("-"))
                            for w in text.split(" "))  # fmt: skip
    elif pic.kind == "letters":
        text = _letters(n, pic.case == "upper")
    elif pic.kind == "roman":
        if n > 10**7:  # an M per thousand: a bound on the output
            msg = f"A roman numeral of {n} exceeds the output budget (at most 10,000,000)"
            raise fail("U1003", msg, 0, value)
        text = _roman(n).upper() if pic.case == "upper" else _roman(n)
    else:
        text = _decimal(n, pic)
    return "-" + text if negative else text


def _parse_words(text: str) -> Any:
    values: dict[str, int] = {}
    for i, (w, o) in enumerate(zip(_SMALL, _SMALL_ORD, strict=True)):
        values[w] = values[o] = i
    for i, w in enumerate(_TENS):
        values[w] = values[w[:-1] + "ieth"] = (i + 2) * 10
    values["hundred"] = values["hundredth"] = 100
    for i, w in enumerate(_SCALES):
        values[w] = values[w + "th"] = 10 ** ((i + 1) * 3)
    words = text.lower().replace(", ", " ").replace(" and ", " ").replace("-", " ").split()
    if not words or any(w not in values for w in words):
        return U
    groups: list[int] = [0]  # completed scaled groups, then the group being built
    for w in words:
        v = values[w]
        if v < 100:
            top = groups.pop()
            if top >= 1000:
                groups.append(top)
                top = 0
            groups.append(top + v)
        else:
            groups.append(groups.pop() * v)
            if groups[-1] > _MAX_NUMBER:  # a number JSON cannot hold: stop multiplying
                raise _too_large(text)
    total = sum(groups)
    return _number(total, text)


_MAX_NUMBER = 2**1024  # above the largest double


def _too_large(text: str) -> Exception:
    return fail(
        "D1001",
        "Number out of range: the parsed integer cannot be represented in JSON",
        0,
        text[:100],
    )


def _number(n: int, text: str) -> Any:
    """An exact int where a double holds it exactly, else the nearest double."""
    if n < 2**53:
        return n
    if n >= _MAX_NUMBER:
        raise _too_large(text)
    return float(n)


def _parse_integer(env: Frame, value: Any, picture: str) -> Any:
    if value is U:
        return U
    pic = _analyse(picture)
    if pic.kind == "words":
        return _parse_words(value)
    if pic.kind == "letters":
        base = 65 if pic.case == "upper" else 97
        if any(not 0 <= ord(c) - base < 26 for c in value):
            return U
        if len(value) > 220:  # 26**218 > 2**1024
            raise _too_large(value)
        n = 0
        for c in value:
            n = n * 26 + ord(c) - base + 1
        return _number(n, value)
    if pic.kind == "roman":
        total, largest = 0, 1
        for c in reversed(value.upper()):
            v = _ROMAN_VALUES.get(c)
            if v is None:
                return U
            total, largest = (total - v, largest) if v < largest else (total + v, v)
        return total
    digits = value[:-2] if pic.ordinal else value
    for _, sep in pic.separators:
        digits = digits.replace(sep, "")
    if not digits or any(not 0 <= ord(c) - pic.zero <= 9 for c in digits):
        return U
    digits = digits.lstrip(chr(pic.zero)) or chr(pic.zero)
    if len(digits) > 309:
        raise _too_large(value)
    return _number(int("".join(chr(ord(c) - pic.zero + 0x30) for c in digits)), value)


INTEGER_FUNCTIONS: dict[str, tuple[Any, str]] = {
    "formatInteger": (_format_integer, "<n-s:s>"),
    "parseInteger": (_parse_integer, "<s-s:n>"),
}
