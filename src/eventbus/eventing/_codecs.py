"""CloudEvents codecs: the Kafka protocol binding and the JSON event format, by hand.

Hand-written with orjson because these run once per event on the hot path: the CloudEvents SDK
(``cloudevents.core``) is about 4x slower. The unit tests check interoperability with the SDK
in both directions.

Kafka records come in three shapes (see the CloudEvents Kafka protocol binding):

* structured mode: header ``content-type: application/cloudevents+json``, the value is the
  whole event as a JSON object (:func:`event_from_json`);
* binary mode: header ``ce_specversion`` present, every attribute a ``ce_<name>`` header,
  ``content-type`` carries ``datacontenttype``, the value is the data;
* plain messages (no CloudEvents headers): wrapped into an event with the source's configured
  ``type``/``source`` and the deterministic id ``{topic}-{partition}-{offset}``, so that a
  redelivered record gets the same id and dedupe recognises it.

The Kafka key becomes the ``partitionkey`` extension unless the event already has one.
Every problem raises :class:`~eventbus.errors.EventDecodeError` naming where it happened
(``topic[partition]@offset``), the bad value and the fix.

This module holds the Kafka binding's fast paths and encoders; the general decoding path is
``_kafka_general``, the JSON event format ``_json_format``, the checks every codec shares
``_event_checks``. The JSON format's functions and ``MAX_JSON_DEPTH`` are importable from
here too, where they always were.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import orjson

from eventbus.errors import EventDecodeError
from eventbus.eventing._event import CloudEvent, format_time, is_json_content_type, utc_ms
from eventbus.eventing._event_checks import (
    _DUMPS,
    _VALID_NAMES_MAX,
    MAX_JSON_DEPTH,
    STRUCTURED_CONTENT_TYPE,
)
from eventbus.eventing._json_format import event_from_json, event_to_json, events_from_json_batch
from eventbus.eventing._kafka_general import _HEADER_ATTRS, decode_kafka_general

__all__ = [
    "MAX_JSON_DEPTH",
    "STRUCTURED_CONTENT_TYPE",
    "KafkaRecord",
    "KafkaRecordLike",
    "RawRecord",
    "decode_kafka",
    "decode_kafka_fast",
    "decode_kafka_records",
    "encode_kafka_binary",
    "encode_kafka_structured",
    "event_from_json",
    "event_to_json",
    "events_from_json_batch",
]


class KafkaRecord(NamedTuple):
    """An event already encoded for a Kafka topic (by a pipeline replica): a sink sends it as
    it is. ``key`` is the event's ``partitionkey`` or None (then the input record's key)."""

    headers: list[tuple[str, bytes]]
    value: bytes | None
    key: bytes | None


class RawRecord(NamedTuple):
    """A consumed Kafka record not decoded yet: what a source ships to a pipeline replica
    when decoding happens there (``FetchSettings(decode_in_dispatch=True)``)."""

    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
    key: bytes | None
    topic: str
    partition: int
    offset: int


_STRUCTURED_CT_BYTES = STRUCTURED_CONTENT_TYPE.encode()
_STRUCTURED_HEADERS: list[tuple[str, bytes]] = [("content-type", _STRUCTURED_CT_BYTES)]
# JSON content types of the decoding fast path (others are checked by is_json_content_type).
_JSON_TYPES = frozenset(("application/json", "application/json; charset=utf-8", "text/json"))
# Attribute name -> binary-mode header name.
_HEADER_NAMES: dict[str, str] = {"datacontenttype": "content-type"}


def decode_kafka_fast(
    value: bytes | None, headers: Sequence[tuple[str, bytes]], key: bytes | None
) -> CloudEvent | None:
    """The usual binary-mode record, decoded; None for anything else (then call :func:`decode_kafka`).

    The usual record: every header a usual spelling of a spec attribute or ``content-type``,
    ``ce_specversion: 1.0``, non-empty id, source and type, no ``time`` or the usual UTC text
    (``YYYY-MM-DDTHH:MM:SS[.fraction]Z``, :func:`~eventbus.eventing._event.utc_ms`), and a JSON
    value with a JSON content type (or none). It takes about half the time of the general
    path, which a source calls for the rest and which names any problem.
    """
    try:
        attrs = {_HEADER_ATTRS[name]: raw.decode() for name, raw in headers}
    except (KeyError, UnicodeDecodeError, AttributeError):
        return None
    ct = attrs.pop("", None)
    if not (
        attrs.get("specversion") == "1.0"
        and attrs.get("id")
        and attrs.get("source")
        and attrs.get("type")
        and ("time" not in attrs or utc_ms(attrs["time"]) is not None)
        and value
        and (ct is None or ct in _JSON_TYPES)
        and len(attrs) + (ct is not None) == len(headers)  # no header given twice
    ):
        return None
    if ct is not None:
        attrs["datacontenttype"] = ct
    if key is not None and "partitionkey" not in attrs:
        if key.__class__ is not bytes:
            return None
        try:
            attrs["partitionkey"] = key.decode()
        except UnicodeDecodeError:
            return None
    try:
        return CloudEvent(attrs, orjson.loads(value))
    except orjson.JSONDecodeError:
        return None  # the general path reports it (or, without a content type, keeps bytes)


def decode_kafka(
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    *,
    key: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    default_type: str,
    default_source: str,
) -> CloudEvent:
    """Decode one Kafka record into a CloudEvent (structured, binary or plain).

    Args:
        value: the record value (``None`` for a tombstone).
        headers: the record headers, ``(name, value)`` pairs.
        key: the record key; becomes the ``partitionkey`` extension unless one is set.
        topic: the topic (for plain-message ids and error messages).
        partition: the partition.
        offset: the offset.
        default_type: ``type`` given to plain messages.
        default_source: ``source`` given to plain messages.

    Returns:
        The event. JSON data is parsed into Python values; other data stays ``bytes``.

    Raises:
        EventDecodeError: the record claims to be a CloudEvent but is not a valid one; the
            message starts with ``topic[partition]@offset``.

    Example:
        >>> e = decode_kafka(b'{"a": 1}', [], key=b"k", topic="t", partition=0, offset=7,
        ...                  default_type="eventbus.message", default_source="kafka://t")
        >>> e.id, e.data, e["partitionkey"]
        ('t-0-7', {'a': 1}, 'k')
    """
    event = decode_kafka_fast(value, headers, key)
    if event is not None:
        return event
    return decode_kafka_general(
        value, headers, key, topic, partition, offset, default_type, default_source
    )


class KafkaRecordLike(Protocol):
    """A consumed Kafka record: an aiokafka ``ConsumerRecord`` or a :class:`RawRecord`."""

    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


def decode_kafka_records(
    records: Sequence[KafkaRecordLike], *, default_type: str, default_source: str | None
) -> tuple[list[CloudEvent], list[tuple[int, EventDecodeError]]]:
    """Decode consumed Kafka records: the one decoding path of every Kafka consumer of events.

    Each record takes the fast path (:func:`decode_kafka_fast`) and, when that declines, the
    general one (:func:`decode_kafka`'s), which names any problem. An undecodable record never
    stops the others.

    Args:
        records: the records, in order.
        default_type: ``type`` given to plain messages.
        default_source: ``source`` given to plain messages; None (or empty) gives
            ``kafka://{topic}``.

    Returns:
        The events of the decodable records, in order; and per undecodable record its index
        in ``records`` and the error (its message starts with ``topic[partition]@offset``).

    Example:
        >>> events, errors = decode_kafka_records(
        ...     [RawRecord(b'{"a": 1}', [], None, "t", 0, 7), RawRecord(b"{}", [("ce_id", b"x")],
        ...      None, "t", 0, 8)], default_type="eventbus.message", default_source=None)
        >>> [e.id for e in events], [(i, type(e).__name__) for i, e in errors]
        (['t-0-7'], [(1, 'EventDecodeError')])
    """
    events: list[CloudEvent] = []
    errors: list[tuple[int, EventDecodeError]] = []
    append = events.append
    fast = decode_kafka_fast
    for i, r in enumerate(records):
        event = fast(r.value, r.headers, r.key)
        if event is None:  # not the usual binary-mode record: the general path
            topic = r.topic
            try:
                event = decode_kafka_general(
                    r.value,
                    r.headers,
                    r.key,
                    topic,
                    r.partition,
                    r.offset,
                    default_type,
                    default_source or f"kafka://{topic}",
                )
            except EventDecodeError as e:
                errors.append((i, e))
                continue
        append(event)
    return events, errors


def _header_value(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, datetime):
        return format_time(value).encode()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value)  # the CloudEvents Binary type's string form
    return str(value).encode()


def encode_kafka_binary(event: CloudEvent) -> tuple[list[tuple[str, bytes]], bytes | None]:
    """Encode an event in Kafka binary mode.

    Every attribute becomes a ``ce_<name>`` header except ``datacontenttype``, which becomes
    ``content-type``. JSON data is serialised with orjson; ``bytes`` data is the value as is;
    no data gives a ``None`` value. The record key (``partitionkey``) is the sink's business.

    Args:
        event: the event.

    Returns:
        ``(headers, value)``.
    """
    names = _HEADER_NAMES
    try:
        # The usual event: every attribute a string whose header name is known already.
        headers = [(names[name], value.encode()) for name, value in event.attributes.items()]
    except (KeyError, AttributeError):
        headers = []
        for name, value in event.attributes.items():
            hname = names.get(name)
            if hname is None:
                hname = "content-type" if name == "datacontenttype" else "ce_" + name
                if len(names) < _VALID_NAMES_MAX:
                    names[name] = hname
            if value.__class__ is str:
                headers.append((hname, value.encode()))
            elif value is not None:
                headers.append((hname, _header_value(value)))
    data = event.data
    if data.__class__ is dict:
        return headers, orjson.dumps(data, option=_DUMPS)
    if data is None:
        return headers, None
    if isinstance(data, (bytes, bytearray, memoryview)):
        return headers, bytes(data)
    if isinstance(data, str) and not is_json_content_type(event.attributes.get("datacontenttype")):
        return headers, data.encode()
    return headers, orjson.dumps(data, option=_DUMPS)


def encode_kafka_structured(event: CloudEvent) -> tuple[list[tuple[str, bytes]], bytes]:
    """Encode an event in Kafka structured mode (the JSON event format).

    Args:
        event: the event.

    Returns:
        ``(headers, value)``: the ``content-type: application/cloudevents+json`` header and
        the event as JSON.
    """
    return list(_STRUCTURED_HEADERS), event_to_json(event)
