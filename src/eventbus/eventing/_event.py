"""The CloudEvent model used on the hot path.

A deliberately small class: a dict of context attributes plus ``data``. Validation of a whole
event happens once, in the codecs at the edge (``eventing._codecs``); steps then work on plain
Python values. ``data`` holds the parsed JSON value when the content type is JSON (or absent),
otherwise ``bytes``.
"""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "REQUIRED_ATTRIBUTES",
    "CloudEvent",
    "format_time",
    "is_json_content_type",
    "parse_time",
    "time_ms",
]

#: Context attributes every CloudEvents 1.0 event carries.
REQUIRED_ATTRIBUTES = ("specversion", "id", "source", "type")


def is_json_content_type(content_type: str | None) -> bool:
    """Whether ``data`` of this content type is JSON (absent means JSON, per the JSON format)."""
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media == "text/json" or media.endswith("+json")


class CloudEvent:
    """One CloudEvent: context attributes and data.

    Args:
        attributes: the context attributes, ``specversion``, ``id``, ``source`` and ``type``
            included; extension attributes sit beside them.
        data: the event data: a JSON value, ``bytes`` for non-JSON content, or ``None``.

    Example:
        >>> e = CloudEvent.create(type="payment.created", source="/shop", data={"amount": 5})
        >>> e.type, e.data["amount"]
        ('payment.created', 5)
    """

    __slots__ = ("attributes", "data")

    def __init__(self, attributes: dict[str, Any], data: Any = None) -> None:
        self.attributes = attributes
        self.data = data

    @classmethod
    def create(
        cls,
        *,
        type: str,
        source: str,
        data: Any = None,
        id: str | None = None,
        time: str | datetime | None = None,
        subject: str | None = None,
        datacontenttype: str | None = None,
        **extensions: Any,
    ) -> CloudEvent:
        """Build an event, generating ``id`` (UUID4) when not given.

        ``time=None`` leaves the attribute out; pass ``"now"``-like values explicitly as a
        ``datetime`` (converted to RFC 3339).
        """
        attrs: dict[str, Any] = {
            "specversion": "1.0",
            "id": id if id is not None else str(uuid.uuid4()),
            "source": source,
            "type": type,
        }
        if time is not None:
            attrs["time"] = format_time(time) if isinstance(time, datetime) else time
        if subject is not None:
            attrs["subject"] = subject
        if datacontenttype is not None:
            attrs["datacontenttype"] = datacontenttype
        elif data is not None and not isinstance(data, bytes):
            attrs["datacontenttype"] = "application/json"
        attrs.update(extensions)
        return cls(attrs, data)

    # -- attribute access -------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The ``id`` attribute."""
        return self.attributes["id"]  # type: ignore[no-any-return]

    @property
    def source(self) -> str:
        """The ``source`` attribute."""
        return self.attributes["source"]  # type: ignore[no-any-return]

    @property
    def type(self) -> str:
        """The ``type`` attribute."""
        return self.attributes["type"]  # type: ignore[no-any-return]

    @property
    def subject(self) -> str | None:
        """The ``subject`` attribute, or None."""
        return self.attributes.get("subject")

    @property
    def time(self) -> str | None:
        """The ``time`` attribute as its RFC 3339 string, or None."""
        return self.attributes.get("time")

    @property
    def datacontenttype(self) -> str | None:
        """The ``datacontenttype`` attribute, or None."""
        return self.attributes.get("datacontenttype")

    def __getitem__(self, name: str) -> Any:
        return self.attributes[name]

    def get(self, name: str, default: Any = None) -> Any:
        """An attribute by name, or ``default``."""
        return self.attributes.get(name, default)

    @property
    def extensions(self) -> dict[str, Any]:
        """The extension attributes (everything but the spec's own attributes)."""
        return {k: v for k, v in self.attributes.items() if k not in _SPEC_ATTRIBUTES}

    def replace(self, *, data: Any = ..., **attributes: Any) -> CloudEvent:
        """A copy with some attributes (and optionally ``data``) replaced.

        An attribute set to ``None`` is removed.
        """
        attrs = dict(self.attributes)
        for k, v in attributes.items():
            if v is None:
                attrs.pop(k, None)
            else:
                attrs[k] = v
        return CloudEvent(attrs, self.data if data is ... else data)

    # -- conversions ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The structured-mode JSON object (``data`` or ``data_base64``)."""
        out = dict(self.attributes)
        if isinstance(self.data, bytes):
            out["data_base64"] = base64.b64encode(self.data).decode("ascii")
        elif self.data is not None:
            out["data"] = self.data
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CloudEvent):
            return NotImplemented
        return self.attributes == other.attributes and self.data == other.data

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CloudEvent({self.attributes!r}, data={self.data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (CloudEvent, (self.attributes, self.data))


_SPEC_ATTRIBUTES = frozenset(
    {"specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time"}
)


def format_time(value: datetime) -> str:
    """RFC 3339 text of a datetime (UTC ``Z`` form for UTC values)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def parse_time(value: str) -> datetime:
    """Parse an RFC 3339 timestamp (``Z`` or offset) into an aware datetime.

    Raises:
        ValueError: naming the value when it is not RFC 3339.
    """
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        msg = f"time {value!r} is not an RFC 3339 timestamp (like '2024-05-01T12:00:00Z')"
        raise ValueError(msg) from None
    if parsed.tzinfo is None:
        msg = f"time {value!r} has no UTC offset; add 'Z' or '+hh:mm'"
        raise ValueError(msg)
    return parsed


#: Epoch seconds of the ``YYYY-MM-DDTHH:MM:SS`` heads :func:`utc_ms` parsed lately: events of
#: one stream share them (a second's events, or a batch's), so each is parsed once.
_HEADS: dict[str, int] = {}
_HEADS_MAX = 4096
#: Epoch milliseconds of the whole texts :func:`utc_ms` parsed lately: an event's time is
#: parsed where it is decoded (checked) and again where a step windows it, a batch apart at
#: most, so the second is a lookup (bounded: cleared when full).
_TIMES: dict[str, int] = {}
_TIMES_MAX = 8192


def utc_ms(value: str) -> int | None:
    """Epoch milliseconds of the usual time text, ``YYYY-MM-DDTHH:MM:SS[.fraction]Z`` (from
    1970 on, a fraction of 1 to 9 digits), exactly (the fraction cut to milliseconds); None
    for any other text, which :func:`parse_time` judges (the usual text is also RFC 3339 to it).

    Example:
        >>> utc_ms("2024-05-01T12:00:00.250Z"), utc_ms("2024-05-01T14:00:00+02:00")
        (1714564800250, None)
    """
    ms = _TIMES.get(value)
    if ms is None:
        ms = _utc_ms(value)
        if ms is not None:
            if len(_TIMES) >= _TIMES_MAX:
                _TIMES.clear()
            _TIMES[value] = ms
    return ms


def _utc_ms(value: str) -> int | None:
    n = len(value)
    if n < 20 or value[-1] != "Z" or value[10] != "T":
        return None
    head = value[:19]
    sec = _HEADS.get(head)
    if sec is None:
        if head[4] != "-" or head[7] != "-" or head[13] != ":" or head[16] != ":":
            return None
        try:
            sec = int(datetime.fromisoformat(head + "+00:00").timestamp())
        except ValueError:
            return None
        if sec < 0:
            return None
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        _HEADS[head] = sec
    if n == 20:
        return sec * 1000
    frac = value[20:-1]
    if value[19] != "." or not 1 <= len(frac) <= 9 or not (frac.isascii() and frac.isdigit()):
        return None
    return sec * 1000 + int((frac + "00")[:3])


def time_ms(value: str) -> int:
    """Epoch milliseconds of an RFC 3339 time (the usual ``...Z`` text on a fast path).

    Raises:
        ValueError: naming the value when it is not RFC 3339.

    Example:
        >>> time_ms("2024-05-01T12:00:00.250Z"), time_ms("2024-05-01T14:00:00+02:00")
        (1714564800250, 1714564800000)
    """
    ms = utc_ms(value)
    if ms is None:
        return int(parse_time(value).timestamp() * 1000)
    return ms
