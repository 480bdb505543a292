"""Cron expressions: parsing, errors that name the field and the fix, next fire times."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

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


def test_leap_day_is_found_years_ahead_fast() -> None:
    start = time.perf_counter()
    assert _next("0 0 29 2 *", _at(2025, 3, 1)) == datetime(2028, 2, 29, tzinfo=UTC)
    assert time.perf_counter() - start < 0.5


def test_time_zone_and_daylight_saving() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    # 02:30 does not exist on 2024-03-31 in Berlin: the next one is on April 1st
    got = _next("30 2 * * *", _at(2024, 3, 30, 12, tz=berlin), berlin)
    assert (got.month, got.day, got.hour, got.minute) == (4, 1, 2, 30)
    # 02:30 happens twice on 2024-10-27: it fires once, then on the 28th
    first = Cron.parse("30 2 * * *").next_after(_at(2024, 10, 27, 0, tz=berlin), berlin)
    second = Cron.parse("30 2 * * *").next_after(first, berlin)
    assert second - first == 24 * 3600 + 3600


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


def test_hostile_long_list_parses_quickly() -> None:
    expr = ",".join(["1"] * 20_000) + " * * * *"
    start = time.perf_counter()
    assert Cron.parse(expr).minutes == (1,)
    assert time.perf_counter() - start < 0.5
