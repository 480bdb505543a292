"""CEL runtime value types that have no exact Python builtin counterpart."""

from __future__ import annotations

import datetime as _dt
from typing import Any, Final

__all__ = [
    "EPOCH",
    "NONE",
    "CelType",
    "Duration",
    "Optional",
    "Timestamp",
    "UInt",
]

_UINT_LIMIT: Final = 2**64

EPOCH: Final = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


class UInt(int):
    """CEL's ``uint``: an unsigned 64-bit integer, distinct from ``int``.

    Example:
        >>> from eventbus import cel
        >>> cel.compile("x + 1u").evaluate({"x": cel.UInt(41)})
        UInt(42)
    """

    __slots__ = ()

    def __new__(cls, value: Any = 0) -> UInt:
        self = super().__new__(cls, value)
        if not 0 <= self < _UINT_LIMIT:
            msg = f"uint out of range: {int(self)}"
            raise ValueError(msg)
        return self

    def __repr__(self) -> str:
        return f"UInt({int(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (UInt, (int(self),))


class Timestamp(_dt.datetime):
    """A UTC timestamp with a sub-microsecond part (``nanos``, 0-999).

    Only produced when the nanoseconds are not a whole number of microseconds;
    otherwise timestamps are plain tz-aware ``datetime.datetime`` values.
    """

    nanos: int

    def __reduce__(self) -> tuple[Any, ...]:
        return (_make_timestamp, (self.replace(tzinfo=None).isoformat(), self.nanos))


def _make_timestamp(iso: str, nanos: int) -> Timestamp:
    base = _dt.datetime.fromisoformat(iso)
    ts = Timestamp(
        base.year, base.month, base.day, base.hour, base.minute, base.second,
        base.microsecond, tzinfo=_dt.UTC,
    )  # fmt: skip
    ts.nanos = nanos
    return ts


class Duration(_dt.timedelta):
    """A duration with a sub-microsecond part (``nanos``, 0-999).

    Only produced when needed; otherwise durations are plain ``datetime.timedelta``.
    """

    nanos: int

    def __reduce__(self) -> tuple[Any, ...]:
        return (_make_duration, (self.days, self.seconds, self.microseconds, self.nanos))


def _make_duration(days: int, seconds: int, microseconds: int, nanos: int) -> Duration:
    d = Duration(days, seconds, microseconds)
    d.nanos = nanos
    return d


class CelType:
    """A CEL type value, as returned by ``type(x)``; compares by name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("CelType", self.name))

    def __repr__(self) -> str:
        return f"CelType({self.name!r})"

    def __str__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple[Any, ...]:
        return (CelType, (self.name,))


class Optional:
    """A CEL ``optional_type`` value: ``optional.of(x)`` or ``optional.none()``."""

    __slots__ = ("has", "value")

    def __init__(self, value: object = None, has: bool = True) -> None:
        self.value = value
        self.has = has

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.has else "optional.none()"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Optional, (self.value, self.has))


NONE: Final = Optional(None, has=False)
