"""The Kafka protocol binding's general decoding path: every record shape (structured,
binary, plain message), every check, a message naming each problem. The usual binary-mode
record takes :func:`~eventbus.eventing._codecs.decode_kafka_fast` instead."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from eventbus.eventing._event import CloudEvent, is_json_content_type
from eventbus.eventing._event_checks import (
    _OCTET_STREAM,
    _SPEC,
    BATCH_CONTENT_TYPE,
    STRUCTURED_CONTENT_TYPE,
    Where,
    _fail,
    _loads_data,
    _validate,
)
from eventbus.eventing._json_format import _from_obj

__all__ = ["decode_kafka_general"]

# Binary-mode header name -> attribute name ('' for content-type), for the usual spellings.
_HEADER_ATTRS: dict[str, str] = {"content-type": "", "Content-Type": ""}
_HEADER_ATTRS.update({"ce_" + name: name for name in _SPEC if name != "datacontenttype"})
_HEADER_ATTRS["ce_partitionkey"] = "partitionkey"


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


def decode_kafka_general(
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
        content_type, ce = _header_texts(headers, where)

    if content_type is not None and content_type.startswith("application/cloudevents"):
        return _decode_structured(value, key, content_type, where)

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


def _header_texts(
    headers: Sequence[tuple[str, bytes]], where: Where
) -> tuple[str | None, dict[str, Any] | None]:
    """Slow path, only to name the offending header (or tolerate null header values)."""
    content_type, ce = None, None
    for name, raw in headers:
        lname = name.lower()
        if lname.startswith("ce_"):
            if ce is None:
                ce = {}
            ce[lname[3:]] = _header_text(raw, name, where)
        elif lname == "content-type":
            content_type = _header_text(raw, name, where)
    return content_type, ce


def _decode_structured(
    value: bytes | None, key: bytes | None, content_type: str, where: Where
) -> CloudEvent:
    """A structured-mode record (``content-type: application/cloudevents...``)."""
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
