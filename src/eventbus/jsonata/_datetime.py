"""``$toMillis(timestamp, picture)`` for numeric XPath picture strings (``[Y0001]-[M01]-[D01]``,
``[H01]:[m01]:[s01].[f001]``, ``[h]:[m] [P]``, ``[d001]``, ``[Z]``, ``[z]``): the picture
becomes an RE2 pattern; names, words, ordinals and roman numerals are unsupported (``U1010``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from eventbus._internal.re2_adapter import compile_regex
from eventbus.jsonata._errors import fail
from eventbus.jsonata._values import UNDEFINED

__all__ = ["parse_picture_time"]

_MARKER = re.compile(r"\[([^\]]*)\]")
_KNOWN = frozenset("YMDdFWwXxHhPmsfZzCE")
_NUMERIC = re.compile(r"^[0-9#]+$")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")  # fmt: skip


def _components(picture: str) -> list[tuple[str, str, int | None] | str]:
    parts: list[tuple[str, str, int | None] | str] = []
    pos = 0
    text = picture.replace("[[", "\x00").replace("]]", "\x01")
    for m in _MARKER.finditer(text):
        if m.start() > pos:
            parts.append(text[pos : m.start()].replace("\x00", "[").replace("\x01", "]"))
        spec = re.sub(r"\s", "", m.group(1))
        pos = m.end()
        letter, rest = spec[:1], spec[1:]
        if letter not in _KNOWN:
            msg = f"Unknown component specifier {letter!r} in date/time picture string"
            raise fail("D3132", msg, 0, letter)
        presentation, _, width = rest.partition(",")
        if letter == "Y" and presentation[:1] == "N":
            msg = "The 'name' modifier can only be applied to months and days in the date/time picture string, not Y"
            raise fail("D3133", msg, 0, letter)
        max_width = None
        if width:
            hi = width.partition("-")[2]
            max_width = int(hi) if hi.isdigit() else None
        parts.append((letter, presentation, max_width))
    if pos < len(text):
        parts.append(text[pos:].replace("\x00", "[").replace("\x01", "]"))
    return parts


def _check_specified(letters: set[str]) -> None:
    under = (
        bool(letters & set("XxWw"))
        or ("F" in letters and not letters & set("Dd"))
        or ("D" in letters and "M" not in letters and "d" not in letters)
        or ("d" in letters and bool(letters & set("MD")))
        or ("m" in letters and not letters & set("Hh"))
        or ("s" in letters and "m" not in letters)
        or ("f" in letters and "s" not in letters)
    )
    if under:
        raise fail("D3136", "The date/time picture string is underspecified", 0)


def _pattern(parts: list[Any]) -> str:
    out = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            out.append(re.escape(part))
            continue
        letter, presentation, max_width = part
        if letter == "P":
            out.append(r"((?i:am|pm|a\.m\.|p\.m\.))")
        elif letter == "Z":
            out.append(r"(Z|[+-]\d{2}:?\d{2})")
        elif letter == "z":
            out.append(r"GMT([+-]\d{1,2}(?::?\d{2})?)")
        elif letter in "MF" and presentation[:1] in ("N", "n"):
            out.append(r"([A-Za-z]+)")
        else:
            shown = presentation or "1"
            ordinal = shown.endswith("o") and _NUMERIC.match(shown[:-1]) is not None
            if ordinal:
                out.append(r"(\d+)(?:st|nd|rd|th)")
                continue
            if not _NUMERIC.match(shown):
                msg = f"$toMillis: the picture presentation {shown!r} of [{letter}] (names, words, ordinals, roman numerals) is not supported by EventBus"
                raise fail("U1010", msg, 0, shown)
            adjacent = i + 1 < len(parts) and not isinstance(parts[i + 1], str)
            if adjacent:
                out.append(rf"(\d{{{max_width or len(shown)}}})")
            elif max_width:
                out.append(rf"(\d{{1,{max_width}}})")
            else:
                out.append(r"(\d+)")
    return "".join(out)


def _offset_minutes(text: str) -> int:
    if text == "Z":
        return 0
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    hours, minutes = (digits, "0") if len(digits) <= 2 else (digits[:-2], digits[-2:])
    return sign * (int(hours) * 60 + int(minutes))


def parse_picture_time(timestamp: str, picture: str, now_millis: int) -> Any:
    """Milliseconds since the epoch, UNDEFINED when ``timestamp`` does not fit ``picture``."""
    parts = _components(picture)
    comps = [p for p in parts if not isinstance(p, str)]
    if not comps:
        return UNDEFINED
    _check_specified({c[0] for c in comps})
    compiled, reason = compile_regex(_pattern(parts))
    if compiled is None:  # pragma: no cover - the pattern is built from escaped parts
        raise fail("D3136", f"cannot use the picture string: {reason}", 0, picture)
    m = compiled.fullmatch(timestamp)
    if m is None:
        return UNDEFINED
    values = {c[0]: g for c, g in zip(comps, m.groups(), strict=True)}
    month = values.get("M")
    if month is not None and not month.isdigit():
        found = [i for i, name in enumerate(_MONTHS, 1) if name.startswith(month.lower()[:3])]
        if not found:
            return UNDEFINED
        values["M"] = str(found[0])
    today = datetime.fromtimestamp(now_millis / 1000, tz=UTC)
    has_date = bool(set(values) & set("YMDd"))
    year = int(values.get("Y", today.year if not has_date or "Y" not in values else 0))
    if "d" in values:
        day = datetime(year, 1, 1, tzinfo=UTC) + timedelta(days=int(values["d"]) - 1)
    elif has_date:
        day = datetime(year, int(values.get("M", 1)), int(values.get("D", 1)), tzinfo=UTC)
    else:
        day = datetime(today.year, today.month, today.day, tzinfo=UTC)
    hour = int(values.get("H", 0))
    if "h" in values:
        hour = int(values["h"]) % 12
        if values.get("P", "am").lower().startswith("p"):
            hour += 12
    frac = values.get("f")
    millis = int(float("0." + frac) * 1000) if frac else 0
    moment = day + timedelta(hours=hour, minutes=int(values.get("m", 0)), seconds=int(values.get("s", 0)),
                             milliseconds=millis)  # fmt: skip
    offset = _offset_minutes(values["Z"]) if "Z" in values else 0
    if "z" in values:
        offset = _offset_minutes(values["z"])
    return int(moment.timestamp() * 1000) - offset * 60_000
