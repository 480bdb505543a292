"""What a ``join`` step emits and fails with: the joined event of a key's sides (a
deterministic id from the key and the combination), the errors of late, ahead and too-large
events with the fix in their message, and the event times these use."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from eventbus import cel
from eventbus.eventing._codecs import event_from_json
from eventbus.eventing._event import CloudEvent, format_time, parse_time
from eventbus.pipelines.steps._join_config import JoinConfig
from eventbus.pipelines.steps._values import json_value

__all__ = [
    "REASONS",
    "EventTimeAheadError",
    "JoinKeyFullError",
    "JoinOutput",
    "LateEventError",
    "ahead_error",
    "event_ms",
    "format_time_ms",
    "key_full_error",
    "late_error",
]


#: Why events emitted nothing: each a counter ``absorbed_<reason>`` in the step's stats.
REASONS = (
    "waiting",
    "superseded",
    "after_match",
    "late",
    "ahead",
    "key_full",
    "evicted",
    "expired",
)


class LateEventError(ValueError):
    """An event's time is older than the join window plus the allowed lateness."""


class EventTimeAheadError(ValueError):
    """An event's time is further ahead of the wall clock than ``max_ahead_s`` (event time)."""


class JoinKeyFullError(ValueError):
    """A key's window holds ``max_key_bytes`` of events already."""


def key_full_error(spec: JoinConfig, key: str, size: int, held: int) -> JoinKeyFullError:
    """A key's window cannot keep an event of ``size`` bytes beside the ``held`` ones."""
    msg = (
        f"join key {key!r} cannot keep this event ({size} bytes): its window holds {held} bytes "
        f"and max_key_bytes is {spec.max_key_bytes}; raise max_key_bytes or shorten window_s"
    )
    return JoinKeyFullError(msg)


def ahead_error(spec: JoinConfig, key: str, t: int, now: int) -> EventTimeAheadError:
    """An event time ``t`` further ahead of ``now`` than ``max_ahead_s``."""
    msg = (
        f"join key {key!r}: event time {format_time_ms(t)} is {(t - now) / 1000:.0f} s ahead of the "
        f"wall clock ({format_time_ms(now)}), beyond max_ahead_s ({spec.max_ahead_s:g} s): fix the "
        "producer's clock or the event's time, or raise max_ahead_s"
    )
    return EventTimeAheadError(msg)


def late_error(spec: JoinConfig, key: str, t: int, watermark: int) -> LateEventError:
    """An event time ``t`` too far behind the ``watermark``."""
    msg = (
        f"join key {key!r}: event time {format_time_ms(t)} is late: {(watermark - t) / 1000:.1f} s "
        f"behind the watermark {format_time_ms(watermark)}, beyond window_s ({spec.window_s:g} s) "
        f"plus allowed_lateness_s ({spec.allowed_lateness_s:g} s); raise allowed_lateness_s "
        "to join events this late"
    )
    return LateEventError(msg)


class JoinOutput:
    """Builds a join step's joined events (``output:``: data, type, source).

    Raises:
        cel.CELError: ``output.data`` uses a variable that is not a side.
    """

    def __init__(self, step_id: str, spec: JoinConfig, pipeline: str) -> None:
        self.id = step_id
        self.side_names = [s.name for s in spec.sides]
        self._data = None
        if spec.output.data is not None:
            program = cel.compile(spec.output.data)
            unknown = sorted(program.variables - set(self.side_names))
            if unknown:
                msg = f"join output.data uses {unknown[0]!r}, which is not a side; its variables are the side names ({', '.join(self.side_names)})"
                raise cel.CELError(msg)
            self._data = program.evaluate
        self.type = spec.output.type or f"{step_id}.joined"
        self.source = spec.output.source or f"/eventbus/{pipeline}/{step_id}"

    def event(
        self,
        key: str,
        h: dict[str, bytes],
        now: int,
        *,
        id_of: str | None = None,
        basis: str | None = None,
    ) -> CloudEvent:
        """The joined event of a key's sides (missing sides named in ``_missing``)."""
        present = {n: event_from_json(h[n]) for n in self.side_names if n in h}
        missing = [n for n in self.side_names if n not in present]
        if self._data is not None:
            act = {
                n: ({**present[n].attributes, "data": present[n].data} if n in present else None)
                for n in self.side_names
            }
            data = json_value(self._data(act))
        else:
            data = {n: e.data for n, e in present.items()}
            if missing:
                data["_missing"] = missing
        if basis is None:
            basis = id_of if id_of is not None else h.get("__t0", b"").decode()
        digest = hashlib.blake2b(f"{key}\x00{basis}".encode(), digest_size=10).hexdigest()
        attrs: dict[str, Any] = {
            "specversion": "1.0",
            "id": f"{self.id}-{digest}",
            "source": self.source,
            "type": self.type,
            "time": format_time_ms(now),
            "datacontenttype": "application/json",
            "partitionkey": key,
        }
        return CloudEvent(attrs, data)


def event_ms(e: CloudEvent) -> int:
    """The event's CloudEvent ``time`` in epoch milliseconds.

    Raises:
        ValueError: the event has no ``time`` (``time: event`` needs one).
    """
    t = e.attributes.get("time")
    if not t:
        msg = f"event {e.attributes.get('id')!r} has no 'time' attribute; a join with time: event windows by it: set it at the source, or use time: processing"
        raise ValueError(msg)
    if not isinstance(t, str):
        msg = f"event {e.attributes.get('id')!r} has time {t!r} ({type(t).__name__}); it must be an RFC 3339 string like '2024-05-01T12:00:00Z'"
        raise ValueError(msg)
    return int(parse_time(t).timestamp() * 1000)


def format_time_ms(ms: int) -> str:
    """RFC 3339 time of epoch milliseconds."""
    return format_time(datetime.fromtimestamp(ms / 1000, tz=UTC))
