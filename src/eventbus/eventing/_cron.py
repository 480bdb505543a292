"""Cron expressions: parsed and iterated by ``cronsim`` (pinned), with EventBus's DST rules.

``minute hour day-of-month month day-of-week``, each ``*``, a number, a range ``a-b``, a list
``a,b``, a step ``*/n`` or ``a-b/n``; months and weekdays also by name (``JAN``, ``MON``);
weekday 7 is Sunday as 0 is; ``L`` (last day of the month), ``LW`` (its last weekday),
``5L`` (its last Friday) and ``5#2`` (its second Friday) as in cronsim. As in Debian cron,
when both day fields are restricted (neither starts with ``*``) a day matches either. The
macros ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and
``@hourly`` stand for their expressions.

Times are wall-clock times in the expression's zone. cronsim walks the wall clock (a naive
calendar, no zone); this module turns each wall time into an instant: a time that does not
exist (skipped by a daylight-saving change) does not fire; a time that happens twice fires
once, the first time. (Debian cron, which cronsim follows in a zone, would run a skipped
02:30 job at 03:00 and an every-15-minutes job twice in the repeated hour; EventBus keeps one
rule for every expression.)

What parses and when it fires is the library's; this module only checks that there are five
fields and words the errors (naming the field, the value and the fix).

Example:
    >>> from datetime import datetime, timezone
    >>> c = Cron.parse("*/15 9-17 * * MON-FRI")
    >>> c.next_after(datetime(2024, 5, 3, 17, 50, tzinfo=timezone.utc).timestamp())
    1714986000.0
"""

from __future__ import annotations

import calendar
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

from cronsim import CronSim, CronSimError

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
# (name, lowest, highest, names), in the order of the fields
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
# cronsim's messages name the field ("Bad day-of-month"): which of ours that is
_CRONSIM_FIELDS = {"minute": 0, "hour": 1, "day-of-month": 2, "month": 3, "day-of-week": 4}
# Any fixed instant: parsing does not depend on it.
_EPOCH = datetime(2000, 1, 1)


class CronError(ValueError):
    """A cron expression that cannot be parsed or never fires (the message says why)."""


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression (see the module docstring for the syntax).

    Attributes:
        text: the expression as written.
        expression: the five fields cronsim reads (a macro expanded).
    """

    text: str
    expression: str

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
        expression = " ".join(parts)
        try:
            CronSim(expression, _EPOCH)
        except CronSimError as e:
            raise CronError(_explain(text, parts, str(e))) from None
        return cls(text=text, expression=expression)

    def fire_times(self, after: float, tz: tzinfo = UTC) -> Iterator[float]:
        """The fire times strictly after ``after`` (epoch seconds), in order, as epoch seconds.

        Ends only when cronsim finds no fire time within 50 years.
        """
        wall = datetime.fromtimestamp(after, tz).replace(tzinfo=None, fold=0)
        for candidate in CronSim(self.expression, wall):
            t = _real(candidate, tz)
            if t is not None and t > after:
                yield t

    def next_after(self, at: float, tz: tzinfo = UTC) -> float:
        """The first fire time strictly after ``at`` (epoch seconds), as epoch seconds.

        Raises:
            CronError: no fire time within 50 years (an expression that parses never does
                this: a day that never comes is refused by :meth:`parse`).
        """
        for t in self.fire_times(at, tz):
            return t
        msg = f"cron {self.text!r} does not fire within 50 years"
        raise CronError(msg)


def _real(wall: datetime, tz: tzinfo) -> float | None:
    """Epoch seconds of a wall-clock time in ``tz`` (the first of two), None when the zone
    skips it."""
    t = wall.replace(tzinfo=tz, fold=0).timestamp()
    back = datetime.fromtimestamp(t, tz)
    if (back.hour, back.minute) != (wall.hour, wall.minute):
        return None
    return t


def _explain(text: str, parts: list[str], problem: str) -> str:
    """The message of an expression cronsim refused with ``problem`` ("Bad minute")."""
    index = _CRONSIM_FIELDS.get(problem.removeprefix("Bad ").strip())
    if index is None:  # not a field's problem (not expected: the fields were counted)
        return f"cron {text!r}: {problem}; write five fields such as '*/5 * * * *'"
    name, low, high, names = _FIELDS[index]
    part = parts[index]
    found = _field_problem(text, part, name, low, high, names)
    if found is not None:
        return found
    if index == 2:  # the days parse, so no month has them: cronsim's "never fires"
        days = [int(d) for d in part.replace("-", ",").split(",") if d.isdigit()]
        day = min(days, default=part)
        return f"cron {text!r} never fires: no month of {parts[3]!r} has day {day}"
    return (
        f"cron {text!r}: {part!r} in the {name} field; write a number {low}-{high}, a range "
        "a-b, a list a,b or a step */n"
    )


def _field_problem(
    text: str, part: str, name: str, low: int, high: int, names: dict[str, int]
) -> str | None:
    """What is wrong with one field (value, range or step), None when nothing we can name."""
    for item in part.split(","):
        body, _, step = item.partition("/")
        if step and (not step.isdigit() or not 1 <= int(step) <= high):
            return f"cron {text!r}: step {step!r} in the {name} field; write /1 to /{high}"
        bounds = [] if body == "*" else body.split("-", 1)
        values = []
        for raw in bounds:
            if raw.upper() in names:
                values.append(names[raw.upper()])
            elif raw.isdigit() and low <= int(raw) <= high:
                values.append(int(raw))
            elif not any(c in raw.upper() for c in "L#W"):  # cronsim's extensions: its word
                hint = f" or a name ({', '.join(list(names)[:3])}...)" if names else ""
                return f"cron {text!r}: {raw!r} in the {name} field; write {low}-{high}{hint}"
        if len(values) == 2 and values[0] > values[1]:
            return (
                f"cron {text!r}: range {body!r} in the {name} field runs backwards; "
                f"write {values[1]}-{values[0]}"
            )
    return None
