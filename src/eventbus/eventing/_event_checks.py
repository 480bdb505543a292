"""CloudEvents checks shared by every codec (Kafka, HTTP, gRPC, the JSON format): the
attributes of one event validated, JSON parsed and held to :data:`MAX_JSON_DEPTH`, errors
that name where the event came from, the bad value and the fix."""

from __future__ import annotations

import re
import reprlib
from datetime import datetime
from typing import Any, TypeAlias

import orjson

from eventbus.errors import EventDecodeError
from eventbus.eventing._event import format_time, parse_time

__all__ = [
    "BATCH_CONTENT_TYPE",
    "MAX_JSON_DEPTH",
    "STRUCTURED_CONTENT_TYPE",
    "Where",
    "check_json_depth",
]

#: Media type of one event in the JSON format (structured mode).
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
#: Media type of the JSON batch format (HTTP only; not allowed on Kafka).
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"

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
