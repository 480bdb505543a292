"""CEL time: RFC 3339 timestamps and Go-style durations parsed, and the accessors
(``getFullYear``, ``getHours``, ...) of timestamps (in a time zone) and durations."""

from __future__ import annotations

import datetime as _dt
import functools
import re
import zoneinfo
from decimal import Decimal
from typing import Any, Final

from eventbus.cel._errors import EvalError, brief
from eventbus.cel._runtime import dur_ns, kind, make_dur, make_ts, no_overload, ts_ns

__all__ = [
    "get_date", "get_day_of_month", "get_day_of_week", "get_day_of_year", "get_full_year",
    "get_hours", "get_milliseconds", "get_minutes", "get_month", "get_seconds",
    "parse_duration", "parse_timestamp",
]  # fmt: skip

_TS_RE: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)


def parse_timestamp(text: str) -> _dt.datetime:
    """Parse an RFC 3339 timestamp with up to nanosecond precision."""
    m = _TS_RE.fullmatch(text)
    if not m:
        msg = f"invalid timestamp {brief(text)}"
        raise EvalError(msg)
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    try:
        base = _dt.datetime(year, month, day, hour, minute, second, tzinfo=_dt.UTC)
    except ValueError:
        msg = f"invalid timestamp {brief(text)}"
        raise EvalError(msg) from None
    frac = int((m.group(7) or "0")[:9].ljust(9, "0"))
    offset = 0
    if m.group(9):
        offset = (int(m.group(10)) * 60 + int(m.group(11))) * 60
        if m.group(9) == "-":
            offset = -offset
    seconds = (base - _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)) // _dt.timedelta(seconds=1)
    return make_ts((seconds - offset) * 10**9 + frac)


_DUR_UNITS: Final = {
    "h": 3600 * 10**9,
    "m": 60 * 10**9,
    "s": 10**9,
    "ms": 10**6,
    "us": 10**3,
    "µs": 10**3,
    "μs": 10**3,
    "ns": 1,
}
_DUR_RE: Final = re.compile(r"([0-9]*(?:\.[0-9]*)?)(h|ms|m|s|us|µs|μs|ns)")


def parse_duration(text: str) -> _dt.timedelta:
    """Parse a Go-style duration string such as ``"1h45m47s"`` or ``"-1.5s"``."""
    body = text
    sign = 1
    if body[:1] in "+-" and body:
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if body == "0":
        return make_dur(0)
    if not body:
        msg = f"invalid duration {brief(text)}"
        raise EvalError(msg)
    total = Decimal(0)
    pos = 0
    while pos < len(body):
        m = _DUR_RE.match(body, pos)
        if not m or m.group(1) in ("", "."):
            msg = f"invalid duration {brief(text)}"
            raise EvalError(msg)
        if len(m.group(1).split(".")[0].lstrip("0")) > 20:
            # Out of range whatever the digits; Decimal -> int of 100,000 digits takes seconds.
            raise EvalError("duration out of range")
        total += Decimal(m.group(1)) * _DUR_UNITS[m.group(2)]
        pos = m.end()
    return make_dur(sign * int(total))


# -- timestamp and duration accessors ---------------------------------------------

_TZ_OFFSET: Final = re.compile(r"([+-]?)(\d{1,2}):(\d{2})")


@functools.lru_cache(maxsize=128)
def _zone(name: str) -> _dt.tzinfo:
    """An IANA time zone or UTC (fixed offsets are handled by ``_local``)."""
    if name == "UTC":
        return _dt.UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        msg = f"unknown time zone {name!r}"
        raise EvalError(msg) from None


def _local(ts: Any, tz: Any, op: str) -> _dt.datetime:
    if kind(ts) != "timestamp" or (tz is not None and kind(tz) != "string"):
        if tz is None:
            no_overload(op, ts)
        no_overload(op, ts, tz)
    secs = ts_ns(ts) // 10**9
    base = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC) + _dt.timedelta(seconds=secs)
    if tz is None:
        return base
    m = _TZ_OFFSET.fullmatch(tz)
    if m:
        delta = _dt.timedelta(hours=int(m.group(2)), minutes=int(m.group(3)))
        return base + (-delta if m.group(1) == "-" else delta)
    return base.astimezone(_zone(tz))


def _time_accessor(name: str, ts_part: Any, dur_part: Any) -> Any:
    def accessor(x: Any, tz: Any = None) -> int:
        if tz is None and kind(x) == "duration":
            if dur_part is None:
                no_overload(name, x)
            return int(dur_part(dur_ns(x)))
        if kind(x) == "timestamp" and name == "getMilliseconds":
            if tz is not None and kind(tz) != "string":
                no_overload(name, x, tz)
            return (ts_ns(x) // 10**6) % 1000
        return int(ts_part(_local(x, tz, name)))

    accessor.__name__ = name
    return accessor


def _trunc_ns(ns: int, unit: int) -> int:
    q = abs(ns) // unit
    return q if ns >= 0 else -q


get_full_year = _time_accessor("getFullYear", lambda d: d.year, None)
get_month = _time_accessor("getMonth", lambda d: d.month - 1, None)
get_day_of_year = _time_accessor("getDayOfYear", lambda d: d.timetuple().tm_yday - 1, None)
get_day_of_month = _time_accessor("getDayOfMonth", lambda d: d.day - 1, None)
get_date = _time_accessor("getDate", lambda d: d.day, None)
get_day_of_week = _time_accessor("getDayOfWeek", lambda d: (d.weekday() + 1) % 7, None)
get_hours = _time_accessor("getHours", lambda d: d.hour, lambda ns: _trunc_ns(ns, 3600 * 10**9))
get_minutes = _time_accessor("getMinutes", lambda d: d.minute, lambda ns: _trunc_ns(ns, 60 * 10**9))
get_seconds = _time_accessor("getSeconds", lambda d: d.second, lambda ns: _trunc_ns(ns, 10**9))
get_milliseconds = _time_accessor("getMilliseconds", None, lambda ns: _trunc_ns(ns, 10**6))
