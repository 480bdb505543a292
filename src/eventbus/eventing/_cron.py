"""Cron expressions: the five standard fields, parsed once, and the next fire time after any
instant in a time zone.

``minute hour day-of-month month day-of-week``, each ``*``, a number, a range ``a-b``, a list
``a,b``, a step ``*/n`` or ``a-b/n``; months and weekdays also by name (``JAN``, ``MON``);
weekday 7 is Sunday as 0 is. As in Vixie cron, when both day fields are restricted a day
matches either. The macros ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily``
(``@midnight``) and ``@hourly`` stand for their expressions.

Times are wall-clock times in the expression's zone: a time that does not exist (skipped by a
daylight-saving change) does not fire; a time that happens twice fires once, the first time.

Example:
    >>> from datetime import datetime, timezone
    >>> c = Cron.parse("*/15 9-17 * * MON-FRI")
    >>> c.next_after(datetime(2024, 5, 3, 17, 50, tzinfo=timezone.utc).timestamp())
    1714986000.0
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo

__all__ = ["Cron", "CronError"]

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {m.upper(): i for i, m in enumerate(calendar.month_abbr) if m}
_DAYS = {d.upper(): (i + 1) % 7 for i, d in enumerate(calendar.day_abbr)}  # SUN=0
# (name, lowest, highest, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
#: How far ahead a fire time is searched (a leap-day expression fires within 8 years).
_HORIZON_DAYS = 8 * 366


class CronError(ValueError):
    """A cron expression that cannot be parsed or never fires (the message says why)."""


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression (see the module docstring for the syntax).

    Attributes:
        text: the expression as written.
        minutes, hours, days, months, weekdays: the values each field admits (weekdays
            0-6, Sunday 0).
        any_day, any_weekday: whether the day-of-month / day-of-week field was ``*``.
    """

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        """Parse ``text``.

        Raises:
            CronError: not five fields, a value out of range, a bad step, or a day that never
                comes (``0 0 30 2 *``).
        """
        expr = _MACROS.get(text.strip().lower(), text)
        parts = expr.split()
        if len(parts) != 5:
            msg = (
                f"cron {text!r} has {len(parts)} fields; write five: minute hour "
                "day-of-month month day-of-week (e.g. '*/5 * * * *'), or a macro such as @hourly"
            )
            raise CronError(msg)
        values = [_field(text, p, *spec) for p, spec in zip(parts, _FIELDS)]
        weekdays = frozenset(d % 7 for d in values[4])
        cron = cls(
            text=text,
            minutes=tuple(sorted(values[0])),
            hours=tuple(sorted(values[1])),
            days=frozenset(values[2]),
            months=frozenset(values[3]),
            weekdays=weekdays,
            any_day=parts[2] == "*",
            any_weekday=parts[4] == "*",
        )
        if cron.any_weekday and not cron.any_day:  # days of month alone pick the days
            longest = max(_month_days(m) for m in cron.months)
            if min(cron.days) > longest:
                msg = (
                    f"cron {text!r} never fires: no month of {parts[3]!r} has day {min(cron.days)}"
                )
                raise CronError(msg)
        return cron

    def _day_matches(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = (d.weekday() + 1) % 7 in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return dow
        if self.any_weekday:
            return dom
        return dom or dow

    def next_after(self, at: float, tz: tzinfo = UTC) -> float:
        """The first fire time strictly after ``at`` (epoch seconds), as epoch seconds."""
        local = datetime.fromtimestamp(at, tz)
        day = local.date()
        for _ in range(_HORIZON_DAYS):
            if self._day_matches(day):
                first_day = day == local.date()
                for hour in self.hours:
                    if first_day and hour < local.hour - 1:
                        continue  # earlier that day (one hour of slack for a DST fold)
                    for minute in self.minutes:
                        wall = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)
                        t = _real(wall)
                        if t is not None and t > at:
                            return t
            day += timedelta(days=1)
        msg = f"cron {self.text!r} does not fire within {_HORIZON_DAYS} days"  # not reached
        raise CronError(msg)


def _real(wall: datetime) -> float | None:
    """Epoch seconds of a wall-clock time, None when the zone skips it (fold 0 = first)."""
    t = wall.timestamp()
    back = datetime.fromtimestamp(t, wall.tzinfo)
    if (back.hour, back.minute) != (wall.hour, wall.minute):
        return None
    return t


def _month_days(month: int) -> int:
    return 29 if month == 2 else calendar.monthrange(2023, month)[1]


def _field(text: str, part: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    out: set[int] = set()
    for item in part.split(","):
        body, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or not 1 <= int(step_text) <= high:
                msg = f"cron {text!r}: step {step_text!r} in the {name} field; write /1 to /{high}"
                raise CronError(msg)
            step = int(step_text)
        if body == "*":
            first, last = low, high
        elif "-" in body:
            a, _, b = body.partition("-")
            first, last = (
                _value(text, a, name, low, high, names),
                _value(text, b, name, low, high, names),
            )
            if first > last:
                msg = f"cron {text!r}: range {body!r} in the {name} field runs backwards; write {last}-{first}"
                raise CronError(msg)
        else:
            first = _value(text, body, name, low, high, names)
            last = high if step_text else first
        out.update(range(first, last + 1, step))
    return out


def _value(text: str, raw: str, name: str, low: int, high: int, names: dict[str, int]) -> int:
    if raw.upper() in names:
        return names[raw.upper()]
    if not raw.isdigit() or not low <= int(raw) <= high:
        hint = f" or a name ({', '.join(list(names)[:3])}...)" if names else ""
        msg = f"cron {text!r}: {raw!r} in the {name} field; write {low}-{high}{hint}"
        raise CronError(msg)
    return int(raw)
