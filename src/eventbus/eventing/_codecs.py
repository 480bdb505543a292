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
"""

from __future__ import annotations

import base64
import binascii
import re
import reprlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypeAlias

import orjson

from eventbus.errors import EventDecodeError
from eventbus.eventing._event import (
    CloudEvent,
    format_time,
    is_json_content_type,
    parse_time,
    utc_ms,
)

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


#: Media type of one event in the JSON format (structured mode).
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
#: Media type of the JSON batch format (HTTP only; not allowed on Kafka).
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"

_STRUCTURED_CT_BYTES = STRUCTURED_CONTENT_TYPE.encode()
_STRUCTURED_HEADERS: list[tuple[str, bytes]] = [("content-type", _STRUCTURED_CT_BYTES)]
_REQUIRED = ("specversion", "id", "source", "type")
_OPTIONAL_STRINGS = ("datacontenttype", "dataschema", "subject")
_SPEC = frozenset(_REQUIRED + _OPTIONAL_STRINGS + ("time",))
_REQUIRED_SET = frozenset(_REQUIRED)
_OPTIONAL_SET = frozenset(_OPTIONAL_STRINGS)
_NAME_RE = re.compile(r"[a-z0-9]{1,20}")
# Extension names seen valid; bounded so a stream of junk names cannot grow it forever.
_VALID_NAMES: set[str] = set(_SPEC)
_VALID_NAMES_MAX = 4096
_OCTET_STREAM = "application/octet-stream"
# datetimes as RFC 3339 with 'Z' for UTC, naive ones taken as UTC (as format_time does).
_DUMPS = orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC
# Binary-mode header name -> attribute name ('' for content-type), for the usual spellings.
_HEADER_ATTRS: dict[str, str] = {"content-type": "", "Content-Type": ""}
_HEADER_ATTRS.update({"ce_" + name: name for name in _SPEC if name != "datacontenttype"})
_HEADER_ATTRS["ce_partitionkey"] = "partitionkey"
# JSON content types of the decoding fast path (others are checked by is_json_content_type).
_JSON_TYPES = frozenset(("application/json", "application/json; charset=utf-8", "text/json"))
# Attribute name -> binary-mode header name.
_HEADER_NAMES: dict[str, str] = {"datacontenttype": "content-type"}
# Extensions whose specs make them strings (distributed tracing, Kafka partitioning): other
# extensions may also be integers or booleans.
_STRING_EXTENSIONS = frozenset(("traceparent", "tracestate", "partitionkey"))

#: Deepest nesting of JSON arrays and objects that a decoded body or data may have. orjson
#: writes at most 254 levels, and data is written again inside an event (structured mode) or
#: a batch, so deeper JSON could be read but never sent on: it is refused where it is read.
MAX_JSON_DEPTH = 128
# orjson.dumps fails past 254 levels: wrapped in this many lists, data deeper than
# MAX_JSON_DEPTH fails it (one C call, instead of a walk in Python).
_DEPTH_PROBE = 254 - MAX_JSON_DEPTH
_OPENERS = (b"[", b"{")

# Values in error messages: bounded, whatever the client sent.
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxdict = 4
_REPR.maxlevel = 2


def _shown(value: Any) -> str:
    return _REPR.repr(value)


# --------------------------------------------------------------------------------------------
# validation shared by every mode
# --------------------------------------------------------------------------------------------
#: Where an event came from, for messages: a label, or (topic, partition, offset).
Where: TypeAlias = "str | tuple[str, int, int]"


def _fail(where: Where, problem: str) -> EventDecodeError:
    if isinstance(where, tuple):
        topic, partition, offset = where
        return EventDecodeError(f"{topic}[{partition}]@{offset}: {problem}")
    return EventDecodeError(f"{where}: {problem}")


def _check_name(name: str, where: Where, label: str) -> None:
    if name in _VALID_NAMES:
        return
    if len(name) > 20 or _NAME_RE.fullmatch(name) is None:
        raise _fail(
            where,
            f"{label} names attribute {_shown(name)}; CloudEvents attribute names must match "
            f"[a-z0-9]{{1,20}} (lowercase letters and digits, at most 20); rename it",
        )
    if len(_VALID_NAMES) < _VALID_NAMES_MAX:
        _VALID_NAMES.add(name)


def _label(name: str, binary: str | None) -> str:
    if binary:
        if name == "datacontenttype":
            return "header content-type"
        return f"header {binary}{name}" if len(name) <= 40 else f"header {binary}{name[:40]}..."
    return f"attribute {_shown(name)}"


def _too_long(attrs: dict[str, Any], where: Where, binary: str | None, max_chars: int) -> None:
    for name, value in attrs.items():
        if value.__class__ is str and len(value) > max_chars:
            raise _fail(
                where,
                f"{_label(name, binary)} is {len(value)} characters long; the gateway takes at "
                f"most {max_chars} per attribute: send long values in the data",
            )
    content_type = attrs.get("datacontenttype")
    if content_type.__class__ is str and not (
        content_type.isascii() and content_type.isprintable()
    ):
        raise _fail(
            where,
            f"{_label('datacontenttype', binary)} is {_shown(content_type)}; a content type is "
            "printable ASCII, like 'application/json'",
        )


def check_json_depth(raw: bytes | str, obj: Any, where: Where, label: str) -> None:
    """Raise EventDecodeError when ``obj`` (parsed from ``raw``) nests arrays and objects
    deeper than :data:`MAX_JSON_DEPTH`.

    Costs two ``bytes.count`` calls when ``raw`` has no more brackets than the limit (the
    usual event), and one ``orjson.dumps`` of ``obj`` otherwise.
    """
    if isinstance(raw, str):
        opened = raw.count("[") + raw.count("{")
    else:
        opened = raw.count(_OPENERS[0]) + raw.count(_OPENERS[1])
    if opened <= MAX_JSON_DEPTH:
        return
    probe = obj
    for _ in range(_DEPTH_PROBE):
        probe = [probe]
    try:
        orjson.dumps(probe)
    except orjson.JSONEncodeError:
        raise _fail(
            where,
            f"{label} nests JSON arrays and objects more than {MAX_JSON_DEPTH} levels deep; "
            f"EventBus takes at most {MAX_JSON_DEPTH}: flatten the data, or send it as a string",
        ) from None


def _validate(
    attrs: dict[str, Any], where: Where, binary: str | None, max_chars: int | None = None
) -> None:
    """Check the attributes of one event; raise EventDecodeError naming the first problem.

    ``binary`` is the header prefix of binary mode (``ce_`` on Kafka, ``ce-`` on HTTP), or
    None for the JSON format. ``max_chars`` (the gateway's): the longest a string value may
    be, and ``datacontenttype`` must be printable ASCII (it becomes a reply header).
    """
    specversion = attrs.get("specversion")
    if specversion != "1.0":
        if specversion is None:
            fix = f"add header {binary}specversion: 1.0" if binary else 'add "specversion": "1.0"'
            raise _fail(where, f"{_label('specversion', binary)} is missing; {fix}")
        example = f"{binary}specversion: 1.0" if binary else '"specversion": "1.0"'
        raise _fail(
            where,
            f"{_label('specversion', binary)} is {_shown(specversion)}; "
            f"EventBus speaks CloudEvents 1.0 ({example})",
        )
    for name in _REQUIRED:
        value = attrs.get(name)
        if value.__class__ is str and value:
            continue
        if value is None:
            fix = f"add header {binary}{name}" if binary else f'add "{name}" to the JSON object'
            raise _fail(
                where, f"{_label(name, binary)} is missing; every CloudEvent needs {name} ({fix})"
            )
        if not isinstance(value, str):
            raise _fail(
                where,
                f"{_label(name, binary)} is {_shown(value)} ({type(value).__name__}); "
                f"{name} must be a string (quote it)",
            )
        if not value:
            raise _fail(where, f"{_label(name, binary)} is ''; {name} must be a non-empty string")
    for name in attrs:
        if binary and name in _VALID_NAMES:
            continue  # header values are always strings: only the name needs checking
        if name in _REQUIRED_SET:
            continue
        value = attrs[name]
        if name in _OPTIONAL_SET:
            if not isinstance(value, str):
                raise _fail(
                    where,
                    f"{_label(name, binary)} is {_shown(value)} ({type(value).__name__}); "
                    f"{name} must be a string (quote it)",
                )
            continue
        if name == "time":
            continue
        if name not in _VALID_NAMES:
            _check_name(name, where, _label(name, binary))
        if binary or value.__class__ is str:
            continue
        if not isinstance(value, int):  # bool is an int
            raise _fail(
                where,
                f"{_label(name, binary)} is {_shown(value)} ({type(value).__name__}); extension "
                "attribute values must be strings, integers or booleans; encode it as a string",
            )
        if name in _STRING_EXTENSIONS:
            raise _fail(
                where,
                f"{_label(name, binary)} is {_shown(value)} ({type(value).__name__}); "
                f"{name} must be a string (quote it)",
            )
    time = attrs.get("time")
    if time is not None:
        if isinstance(time, datetime):
            attrs["time"] = time = format_time(time)
        if not isinstance(time, str):
            raise _fail(
                where,
                f"{_label('time', binary)} is {_shown(time)} ({type(time).__name__}); "
                f"time must be an RFC 3339 string like '2024-05-01T12:00:00Z'",
            )
        try:
            parse_time(time)
        except ValueError:
            raise _fail(
                where,
                f"{_label('time', binary)} is {_shown(time)}; time must be RFC 3339 with an offset, "
                f"like '2024-05-01T12:00:00Z'",
            ) from None
    if max_chars is not None:
        _too_long(attrs, where, binary, max_chars)


def _loads_data(raw: bytes, where: Where, content_type: str | None, label: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        shown = raw[:60]
        raise _fail(
            where,
            f"{label} is not valid JSON ({e}; starts {shown!r}) but the content type is "
            f"{content_type!r}; send JSON, or set the content type to the payload's media type",
        ) from None


def _loads_json(raw: bytes, where: Where, content_type: str | None, label: str) -> Any:
    # _loads_data, held to MAX_JSON_DEPTH: for what arrives from outside (HTTP, gRPC).
    obj = _loads_data(raw, where, content_type, label)
    check_json_depth(raw, obj, where, label)
    return obj


# --------------------------------------------------------------------------------------------
# JSON format (structured mode, HTTP structured and batch modes)
# --------------------------------------------------------------------------------------------
def _from_obj(
    obj: Any, where: Where, owned: bool = False, max_chars: int | None = None
) -> CloudEvent:
    if not isinstance(obj, dict):
        raise _fail(
            where,
            f"the event is a JSON {type(obj).__name__}, not an object; structured mode carries "
            f"one event as a JSON object with specversion, id, source and type",
        )
    attrs: dict[str, Any] = obj if owned else dict(obj)  # owned: freshly parsed, ours to change
    if None in attrs.values():  # null means absent in the JSON format
        attrs = {k: v for k, v in attrs.items() if v is not None}
    has_data = "data" in attrs
    b64 = attrs.pop("data_base64", None)
    data = attrs.pop("data", None)
    if b64 is not None:
        if has_data:
            raise _fail(where, 'the event has both "data" and "data_base64"; send only one')
        if not isinstance(b64, str):
            raise _fail(
                where,
                f'"data_base64" is {_shown(b64)} ({type(b64).__name__}); it must be a base64 string',
            )
        try:
            data = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            shown = b64[:40]
            raise _fail(
                where,
                f'"data_base64" is not valid base64 (starts {shown!r}); encode the bytes '
                'with standard base64 (RFC 4648), or send JSON data in "data"',
            ) from None
    _validate(attrs, where, binary=None, max_chars=max_chars)
    if isinstance(data, str) and not is_json_content_type(attrs.get("datacontenttype")):
        # Non-JSON content is bytes in the model; the JSON format carries text as a string.
        data = data.encode()
    return CloudEvent(attrs, data)


def event_from_json(raw: bytes | str | dict[str, Any]) -> CloudEvent:
    """Decode one event in the CloudEvents JSON format (structured mode).

    Args:
        raw: the JSON text, or an already parsed JSON object.

    Returns:
        The event; ``data_base64`` becomes ``bytes`` data.

    Raises:
        EventDecodeError: the text is not JSON or not a valid CloudEvents 1.0 event.

    Example:
        >>> event_from_json(b'{"specversion":"1.0","id":"1","source":"/s","type":"t"}').id
        '1'
    """
    if isinstance(raw, dict):
        return _from_obj(raw, "CloudEvent JSON")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        msg = f"CloudEvent JSON: not valid JSON ({e}); send one event as a JSON object"
        raise EventDecodeError(msg) from None
    check_json_depth(raw, obj, "CloudEvent JSON", "the event")
    return _from_obj(obj, "CloudEvent JSON", owned=True)


def events_from_json_batch(
    raw: bytes | str | list[Any], *, max_events: int | None = None, max_chars: int | None = None
) -> list[CloudEvent]:
    """Decode the CloudEvents JSON batch format: a JSON array of events.

    Args:
        raw: the JSON text, or an already parsed JSON array.
        max_events: most events the batch may have (None: any number).
        max_chars: longest string attribute value (None: any length).

    Returns:
        The events, in order.

    Raises:
        EventDecodeError: naming the index of the first bad event (``batch[3]: ...``), or
            the batch's size or depth when over the limits.
    """
    owned = not isinstance(raw, list)
    if not isinstance(raw, list):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            msg = f"CloudEvent batch: not valid JSON ({e}); send a JSON array of events"
            raise EventDecodeError(msg) from None
        check_json_depth(raw, parsed, "CloudEvent batch", "the batch")
        raw = parsed
    if not isinstance(raw, list):
        msg = (
            f"CloudEvent batch: got a JSON {type(raw).__name__}; the batch format is a JSON "
            "array of events (send a single event as structured mode instead)"
        )
        raise EventDecodeError(msg)
    if max_events is not None and len(raw) > max_events:
        msg = (
            f"CloudEvent batch: the batch has {len(raw)} events; at most {max_events} are "
            "taken per request: split it into several requests"
        )
        raise EventDecodeError(msg)
    return [_from_obj(obj, f"batch[{i}]", owned, max_chars) for i, obj in enumerate(raw)]


def _to_obj(event: CloudEvent) -> dict[str, Any]:
    out = dict(event.attributes)
    data = event.data
    if isinstance(data, (bytes, bytearray, memoryview)):
        out["data_base64"] = base64.b64encode(data).decode("ascii")
    elif data is not None:
        out["data"] = data
    return out


def event_to_json(event: CloudEvent) -> bytes:
    """Encode one event in the CloudEvents JSON format (structured mode).

    ``bytes`` data is written as ``data_base64``; other data as the ``data`` JSON value.

    Args:
        event: the event.

    Returns:
        UTF-8 JSON bytes.

    Example:
        >>> event_to_json(CloudEvent({"specversion": "1.0", "id": "1", "source": "/s",
        ...                           "type": "t"}, data=b"hi"))[-20:]
        b'"data_base64":"aGk="}'
    """
    return orjson.dumps(_to_obj(event), option=_DUMPS)


# --------------------------------------------------------------------------------------------
# Kafka protocol binding
# --------------------------------------------------------------------------------------------
def _header_text(raw: bytes | None, name: str, where: Where) -> str:
    if raw is None:
        return ""
    try:
        return raw.decode() if isinstance(raw, bytes) else bytes(raw).decode()
    except UnicodeDecodeError:
        shown = bytes(raw)[:40]
        raise _fail(
            where,
            f"header {name} is not UTF-8 ({shown!r}); CloudEvents header values are UTF-8 text",
        ) from None


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
    return _decode_kafka_general(
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
                event = _decode_kafka_general(
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


def _decode_kafka_general(
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    key: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    default_type: str,
    default_source: str,
) -> CloudEvent:
    # Every shape, every check; see decode_kafka.
    where: Where = (topic, partition, offset)
    content_type: str | None = None
    ce: dict[str, Any] | None = None
    known = _HEADER_ATTRS
    try:
        for name, raw in headers:
            attr = known.get(name)
            if attr is None:
                lname = name.lower()
                if lname.startswith("ce_"):
                    attr = lname[3:]
                elif lname == "content-type":
                    attr = ""
                else:
                    continue
            if attr:
                if ce is None:
                    ce = {}
                ce[attr] = raw.decode()
            else:
                content_type = raw.decode()
    except (UnicodeDecodeError, AttributeError):
        # Slow path, only to name the offending header (or tolerate null header values).
        content_type, ce = None, None
        for name, raw in headers:
            lname = name.lower()
            if lname.startswith("ce_"):
                if ce is None:
                    ce = {}
                ce[lname[3:]] = _header_text(raw, name, where)
            elif lname == "content-type":
                content_type = _header_text(raw, name, where)

    if content_type is not None and content_type.startswith("application/cloudevents"):
        media = content_type.split(";", 1)[0].strip().lower()
        if media == BATCH_CONTENT_TYPE:
            raise _fail(
                where,
                f"header content-type is {content_type!r}; the Kafka binding carries one event "
                f"per record, so send each event as its own record ({STRUCTURED_CONTENT_TYPE})",
            )
        if media != STRUCTURED_CONTENT_TYPE:
            raise _fail(
                where,
                f"header content-type is {content_type!r}; EventBus reads the JSON event format "
                f"only (content-type: {STRUCTURED_CONTENT_TYPE})",
            )
        if not value:
            raise _fail(
                where,
                f"header content-type is {STRUCTURED_CONTENT_TYPE} but the value is empty; "
                "send the event as a JSON object in the value",
            )
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError as e:
            shown = bytes(value[:60])
            raise _fail(
                where,
                f"value is not valid JSON ({e}; starts {shown!r}) but header content-type is "
                f"{STRUCTURED_CONTENT_TYPE}; send the event as a JSON object, or use binary mode",
            ) from None
        event = _from_obj(obj, where, owned=True)
        if key is not None and "partitionkey" not in event.attributes:
            event.attributes["partitionkey"] = _header_text(key, "key", where)
        return event

    if ce is not None:
        if "specversion" not in ce:
            names = ", ".join(sorted("ce_" + n for n in ce))
            raise _fail(
                where,
                f"headers {names} look like a binary-mode CloudEvent but header ce_specversion "
                "is missing; add header ce_specversion: 1.0 (or drop the ce_ headers to send a "
                "plain message)",
            )
        attrs: dict[str, Any] = ce
        if "datacontenttype" in attrs:
            raise _fail(
                where,
                "header ce_datacontenttype is set; in the Kafka binding datacontenttype "
                "travels in the content-type header; rename the header to content-type",
            )
        if content_type is not None:
            attrs["datacontenttype"] = content_type
        _validate(attrs, where, binary="ce_")
        if key is not None and "partitionkey" not in attrs:
            attrs["partitionkey"] = _header_text(key, "key", where)
        if value is None:
            return CloudEvent(attrs, None)
        if content_type is None:
            # No content type: JSON if it parses, otherwise opaque bytes, said explicitly so
            # that data and datacontenttype agree.
            try:
                return CloudEvent(attrs, orjson.loads(value) if value else None)
            except orjson.JSONDecodeError:
                attrs["datacontenttype"] = _OCTET_STREAM
                return CloudEvent(attrs, bytes(value))
        if is_json_content_type(content_type):
            if not value:
                return CloudEvent(attrs, None)
            return CloudEvent(attrs, _loads_data(value, where, content_type, "value"))
        return CloudEvent(attrs, bytes(value))

    # A plain message: wrap it.
    attrs = {
        "specversion": "1.0",
        "id": f"{topic}-{partition}-{offset}",
        "source": default_source,
        "type": default_type,
    }
    data: Any = None
    if value is not None:
        if content_type is not None:
            attrs["datacontenttype"] = content_type
            if is_json_content_type(content_type):
                data = _loads_data(value, where, content_type, "value") if value else None
            else:
                data = bytes(value)
        else:
            try:
                data = orjson.loads(value)
                attrs["datacontenttype"] = "application/json"
            except orjson.JSONDecodeError:
                data = bytes(value)
                attrs["datacontenttype"] = _OCTET_STREAM
    if key is not None:
        attrs["partitionkey"] = _header_text(key, "key", where)
    return CloudEvent(attrs, data)


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
