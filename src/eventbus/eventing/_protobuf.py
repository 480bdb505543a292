"""The CloudEvents protobuf format (``cloudevents.proto``) to and from :class:`CloudEvent`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from eventbus.errors import EventDecodeError
from eventbus.eventing._event import CloudEvent, format_time, is_json_content_type, parse_time
from eventbus.eventing._event_checks import _DUMPS, _loads_json, _validate
from eventbus.eventing._proto import cloudevents_pb2 as pb

__all__ = ["event_from_proto", "event_to_proto", "events_from_proto_batch", "events_to_proto_batch"]

_INT32 = (-(2**31), 2**31 - 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# google.protobuf.Timestamp's range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
_MIN_SECONDS = -62_135_596_800
_MAX_SECONDS = 253_402_300_799


def _timestamp(name: str, seconds: int, nanos: int, where: str) -> str:
    if not (_MIN_SECONDS <= seconds <= _MAX_SECONDS and 0 <= nanos <= 999_999_999):
        msg = (
            f"{where}: attribute {name!r} is a ce_timestamp of seconds={seconds}, nanos={nanos}; "
            f"a Timestamp has seconds from {_MIN_SECONDS} to {_MAX_SECONDS} (years 1 to 9999) "
            "and nanos from 0 to 999999999"
        )
        raise EventDecodeError(msg)
    # Exact (no float): microseconds, as datetime keeps them.
    return format_time(_EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000))


def event_from_proto(
    msg: pb.CloudEvent, where: str = "gRPC event", *, max_attribute_chars: int | None = None
) -> CloudEvent:
    """Decode a protobuf ``CloudEvent``.

    JSON data (``text_data`` or ``binary_data`` with a JSON content type) is parsed and may
    nest at most :data:`~eventbus.eventing._event_checks.MAX_JSON_DEPTH` levels; other data stays
    ``bytes``; ``proto_data`` becomes the packed message's bytes with ``dataschema`` set to
    its type URL when none is given.

    Args:
        msg: the message.
        where: how errors name the event.
        max_attribute_chars: longest string attribute value (None: any length).

    Raises:
        EventDecodeError: a required attribute is missing or invalid (named).
    """
    attrs: dict[str, Any] = {
        "specversion": msg.spec_version,
        "id": msg.id,
        "source": msg.source,
        "type": msg.type,
    }
    for name, value in msg.attributes.items():
        kind = value.WhichOneof("attr")
        if kind == "ce_timestamp":
            ts = value.ce_timestamp
            attrs[name] = _timestamp(name, ts.seconds, ts.nanos, where)
        elif kind == "ce_bytes":
            attrs[name] = value.ce_bytes.hex()
        elif kind is not None:
            attrs[name] = getattr(value, kind)
    for name in ("specversion", "id", "source", "type"):
        if attrs[name] == "":
            del attrs[name]
    _validate(attrs, where, binary=None, max_chars=max_attribute_chars)
    content_type = attrs.get("datacontenttype")
    kind = msg.WhichOneof("data")
    data: Any = None
    if kind == "text_data":
        text = msg.text_data
        if content_type is None or is_json_content_type(content_type):
            data = _loads_json(
                text.encode(), where, content_type or "application/json", "text_data"
            )
            attrs.setdefault("datacontenttype", "application/json")
        else:
            data = text.encode()
    elif kind == "binary_data":
        raw = msg.binary_data
        data = (
            _loads_json(raw, where, content_type, "binary_data")
            if is_json_content_type(content_type)
            else bytes(raw)
        )
    elif kind == "proto_data":
        data = msg.proto_data.value
        attrs.setdefault("datacontenttype", "application/protobuf")
        attrs.setdefault("dataschema", msg.proto_data.type_url)
    return CloudEvent(attrs, data)


def event_to_proto(event: CloudEvent) -> pb.CloudEvent:
    """Encode an event as a protobuf ``CloudEvent`` (JSON data as ``text_data``)."""
    a = event.attributes
    msg = pb.CloudEvent(
        id=a["id"], source=a["source"], spec_version=a.get("specversion", "1.0"), type=a["type"]
    )
    for name, value in a.items():
        if name in ("id", "source", "specversion", "type") or value is None:
            continue
        attr = msg.attributes[name]
        if name == "time":
            t = parse_time(value) if isinstance(value, str) else value
            attr.ce_timestamp.FromDatetime(t.astimezone(UTC))
        elif name == "dataschema":
            attr.ce_uri = str(value)
        elif isinstance(value, bool):
            attr.ce_boolean = value
        elif isinstance(value, int) and _INT32[0] <= value <= _INT32[1]:
            attr.ce_integer = value
        else:
            attr.ce_string = str(value)
    data = event.data
    if data is None:
        return msg
    if isinstance(data, (bytes, bytearray, memoryview)):
        msg.binary_data = bytes(data)
    elif isinstance(data, str) and not is_json_content_type(a.get("datacontenttype")):
        msg.text_data = data
    else:
        msg.text_data = orjson.dumps(data, option=_DUMPS).decode()
        if "datacontenttype" not in a:
            msg.attributes["datacontenttype"].ce_string = "application/json"
    return msg


def events_to_proto_batch(events: list[CloudEvent]) -> pb.CloudEventBatch:
    """Encode events as a ``CloudEventBatch``."""
    return pb.CloudEventBatch(events=[event_to_proto(e) for e in events])


def events_from_proto_batch(
    batch: pb.CloudEventBatch, *, max_attribute_chars: int | None = None
) -> list[CloudEvent]:
    """Decode every event of a batch; an error names the index (``batch[3]: ...``)."""
    return [
        event_from_proto(m, f"batch[{i}]", max_attribute_chars=max_attribute_chars)
        for i, m in enumerate(batch.events)
    ]
