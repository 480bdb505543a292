"""Cron expressions: parsing, errors that name the field and the fix, next fire times.

cronsim parses and iterates; these tests pin EventBus's rules on top of it (five fields,
macros, the messages, and one daylight-saving rule for every expression)."""

from __future__ import annotations

import random
import re
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from eventbus.eventing._cron import Cron, CronError


def _at(*args: int, tz: object = UTC) -> float:
    return datetime(*args, tzinfo=tz).timestamp()  # type: ignore[arg-type,misc]


def _next(expr: str, at: float, tz: object = UTC) -> datetime:
    return datetime.fromtimestamp(Cron.parse(expr).next_after(at, tz), tz)  # type: ignore[arg-type]


def test_steps_ranges_lists_and_names() -> None:
    assert _next("*/15 9-17 * * MON-FRI", _at(2024, 5, 3, 17, 50)) == datetime(
        2024, 5, 6, 9, 0, tzinfo=UTC
    )  # Friday evening -> Monday morning
    assert _next("5,35 * * * *", _at(2024, 1, 1, 0, 5)) == datetime(2024, 1, 1, 0, 35, tzinfo=UTC)
    assert _next("0 12 1 JAN,jul *", _at(2024, 2, 1)) == datetime(2024, 7, 1, 12, tzinfo=UTC)
    assert _next("0 0 * * 7", _at(2024, 5, 1)) == datetime(2024, 5, 5, tzinfo=UTC)  # 7 = Sunday
    assert _next("10-20/5 * * * *", _at(2024, 1, 1, 0, 16)) == datetime(
        2024, 1, 1, 0, 20, tzinfo=UTC
    )


def test_strictly_after_and_macros() -> None:
    assert _next("@hourly", _at(2024, 1, 1, 3)) == datetime(2024, 1, 1, 4, tzinfo=UTC)
    assert _next("@daily", _at(2024, 1, 1, 0, 0)) == datetime(2024, 1, 2, tzinfo=UTC)
    assert _next("@yearly", _at(2024, 6, 1)) == datetime(2025, 1, 1, tzinfo=UTC)


def test_both_day_fields_match_either() -> None:
    # the 13th, or any Friday (Vixie cron): 2024-09-06 is a Friday before the 13th
    assert _next("0 0 13 * FRI", _at(2024, 9, 1)) == datetime(2024, 9, 6, tzinfo=UTC)
    # a day that never comes alone is an error; with a weekday it fires on the weekday
    assert _next("0 0 30 2 MON", _at(2024, 2, 1)) == datetime(2024, 2, 5, tzinfo=UTC)


def test_leap_day_is_found_years_ahead() -> None:
    start = time.perf_counter()
    assert _next("0 0 29 2 *", _at(2025, 3, 1)) == datetime(2028, 2, 29, tzinfo=UTC)
    # milliseconds; a search minute by minute over three years would take minutes
    assert time.perf_counter() - start < 10


def test_cronsim_extensions() -> None:
    assert _next("0 0 L * *", _at(2024, 2, 1)) == datetime(2024, 2, 29, tzinfo=UTC)
    assert _next("0 0 * * 5#2", _at(2024, 5, 1)) == datetime(2024, 5, 10, tzinfo=UTC)
    assert _next("0 0 * * 5L", _at(2024, 5, 1)) == datetime(2024, 5, 31, tzinfo=UTC)


def test_utc_fire_times_are_cronsims() -> None:
    # The library is the oracle: in UTC (no daylight saving) every fire time is cronsim's.
    rng = random.Random(3)
    exprs = ["*/7 * * * *", "0 */5 * * 1-5", "15 3 1,15 * *", "0 0 13 * FRI", "30 2 * 3,10 SUN"]
    for expr in exprs:
        start = datetime(2024, 1, 1, tzinfo=UTC) + timedelta(minutes=rng.randrange(500_000))
        ours = Cron.parse(expr).fire_times(start.timestamp())
        theirs = CronSim(expr, start)
        for _ in range(50):
            assert next(ours) == next(theirs).timestamp(), expr


def test_time_zone_and_daylight_saving() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    # 02:30 does not exist on 2024-03-31 in Berlin: the next one is on April 1st
    got = _next("30 2 * * *", _at(2024, 3, 30, 12, tz=berlin), berlin)
    assert (got.month, got.day, got.hour, got.minute) == (4, 1, 2, 30)
    # 02:30 happens twice on 2024-10-27: it fires once, then on the 28th
    first = Cron.parse("30 2 * * *").next_after(_at(2024, 10, 27, 0, tz=berlin), berlin)
    second = Cron.parse("30 2 * * *").next_after(first, berlin)
    assert second - first == 24 * 3600 + 3600


def _walls(expr: str, after: float, tz: ZoneInfo, n: int) -> list[tuple[str, int]]:
    times = Cron.parse(expr).fire_times(after, tz)
    out = []
    for _ in range(n):
        d = datetime.fromtimestamp(next(times), tz)
        out.append((d.strftime("%H:%M"), d.utcoffset().seconds // 3600))  # type: ignore[union-attr]
    return out


def test_daylight_saving_one_rule_for_every_expression() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    # spring forward (02:00 -> 03:00): every wall time of the skipped hour does not fire,
    # for a wildcard expression too (Debian cron would run a fixed-time job at 03:00)
    spring = _at(2024, 3, 31, 1, 0, tz=berlin)
    assert _walls("*/30 * * * *", spring, berlin, 3) == [("01:30", 1), ("03:00", 2), ("03:30", 2)]
    assert _walls("30 2 * * *", spring, berlin, 1) == [("02:30", 2)]  # April 1st, not 03:00
    # fall back (03:00 -> 02:00): the repeated hour fires once, the first time
    fall = _at(2024, 10, 27, 1, 45, tz=berlin)
    assert _walls("*/30 * * * *", fall, berlin, 4) == [
        ("02:00", 2),
        ("02:30", 2),
        ("03:00", 1),
        ("03:30", 1),
    ]
    # asked from inside the repeated hour (its second pass), the next is after it
    second_pass = _at(2024, 10, 27, 1, 10, tz=UTC)  # 02:10 CET, the second 02:10
    assert _walls("*/30 * * * *", second_pass, berlin, 1) == [("03:00", 1)]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        (
            "* * *",
            "cron '* * *' has 3 fields; write five: minute hour day-of-month month day-of-week",
        ),
        ("*/0 * * * *", "cron '*/0 * * * *': step '0' in the minute field; write /1 to /59"),
        ("61 * * * *", "cron '61 * * * *': '61' in the minute field; write 0-59"),
        ("0 0 * FOO *", "cron '0 0 * FOO *': 'FOO' in the month field; write 1-12 or a name (JAN"),
        ("5-1 * * * *", "range '5-1' in the minute field runs backwards; write 1-5"),
        ("0 0 30 2 *", "cron '0 0 30 2 *' never fires: no month of '2' has day 30"),
        ("0 0 31 4,6 *", "never fires: no month of '4,6' has day 31"),
        ("", "cron '' has 0 fields"),
        ("* * * * * *", "has 6 fields"),
    ],
)
def test_bad_expressions_name_the_field_and_the_fix(expr: str, message: str) -> None:
    with pytest.raises(CronError, match=re.escape(message)):
        Cron.parse(expr)


def test_hostile_long_list_parses_in_linear_time() -> None:
    expr = ",".join(["1"] * 20_000) + " * * * *"
    start = time.perf_counter()
    assert _next(expr, _at(2024, 1, 1)) == datetime(2024, 1, 1, 0, 1, tzinfo=UTC)
    # ~10 ms; quadratic work in the items (4e8 steps) would take minutes
    assert time.perf_counter() - start < 10
