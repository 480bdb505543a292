"""The function table: (name, is_member) -> {arity: implementation}.

Arity counts the receiver of member calls. The compiler checks calls against
this table (unknown function, wrong argument count) and binds implementations.
"""

from __future__ import annotations

from typing import Any, Final

from eventbus.cel import _ext_strings as strs
from eventbus.cel import _stdlib as std
from eventbus.cel import _time
from eventbus.cel._ext_misc import FUNCTIONS as _EXT_FUNCTIONS

__all__ = ["FUNCTIONS", "function_names"]

_TIME_ACCESSORS: Final = {
    "getFullYear": _time.get_full_year,
    "getMonth": _time.get_month,
    "getDayOfYear": _time.get_day_of_year,
    "getDayOfMonth": _time.get_day_of_month,
    "getDate": _time.get_date,
    "getDayOfWeek": _time.get_day_of_week,
    "getHours": _time.get_hours,
    "getMinutes": _time.get_minutes,
    "getSeconds": _time.get_seconds,
    "getMilliseconds": _time.get_milliseconds,
}

FUNCTIONS: Final[dict[tuple[str, bool], dict[int, Any]]] = {
    ("size", False): {1: std.size},
    ("size", True): {1: std.size},
    ("contains", True): {2: std.contains},
    ("startsWith", True): {2: std.starts_with},
    ("endsWith", True): {2: std.ends_with},
    ("matches", True): {2: std.matches},
    ("matches", False): {2: std.matches},
    ("int", False): {1: std.to_int},
    ("uint", False): {1: std.to_uint},
    ("double", False): {1: std.to_double},
    ("string", False): {1: std.to_string},
    ("bytes", False): {1: std.to_bytes},
    ("bool", False): {1: std.to_bool},
    ("timestamp", False): {1: std.to_timestamp},
    ("duration", False): {1: std.to_duration},
    ("dyn", False): {1: std.dyn},
    ("type", False): {1: std.type_of},
    ("charAt", True): {2: strs.char_at},
    ("indexOf", True): {2: strs.index_of, 3: strs.index_of},
    ("lastIndexOf", True): {2: strs.last_index_of, 3: strs.last_index_of},
    ("lowerAscii", True): {1: strs.lower_ascii},
    ("upperAscii", True): {1: strs.upper_ascii},
    ("replace", True): {3: strs.replace, 4: strs.replace},
    ("split", True): {2: strs.split, 3: strs.split},
    ("substring", True): {2: strs.substring, 3: strs.substring},
    ("trim", True): {1: strs.trim},
    ("join", True): {1: strs.join, 2: strs.join},
    ("reverse", True): {1: strs.reverse},
    ("format", True): {2: strs.format_},
    ("quote", True): {1: strs.quote},
    ("strings.quote", False): {1: strs.quote},
    **{(name, True): {1: fn, 2: fn} for name, fn in _TIME_ACCESSORS.items()},
    **_EXT_FUNCTIONS,
}


def function_names() -> list[str]:
    """All known function names, for "did you mean" hints."""
    return sorted({name for name, _ in FUNCTIONS})
