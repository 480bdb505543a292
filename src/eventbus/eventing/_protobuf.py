"""The CloudEvents protobuf format (``cloudevents.proto``) to and from :class:`CloudEvent`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from eventbus.eventing._codecs import _DUMPS, _loads_data, _validate
from eventbus.eventing._event import CloudEvent, format_time, is_json_content_type, parse_time
from eventbus.eventing._proto import cloudevents_pb2 as pb

__all__ = ["event_from_proto", "event_to_proto", "events_from_proto_batch", "events_to_proto_batch"]

_INT32 = (-(2**31), 2**31 - 1)


def event_from_proto(msg: pb.CloudEvent, where: str = "gRPC event") -> CloudEvent:
    """Decode a protobuf ``CloudEvent``.

    JSON data (``text_data`` or ``binary_data`` with a JSON content type) is parsed; other
    data stays ``bytes``; ``proto_data`` becomes the packed message's bytes with
    ``dataschema`` set to its type URL when none is given.

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
            attrs[name] = format_time(datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=UTC))
        elif kind == "ce_bytes":
            attrs[name] = value.ce_bytes.hex()
        elif kind is not None:
            attrs[name] = getattr(value, kind)
    for name in ("specversion", "id", "source", "type"):
        if attrs[name] == "":
            del attrs[name]
    _validate(attrs, where, binary=None)
    content_type = attrs.get("datacontenttype")
    kind = msg.WhichOneof("data")
    data: Any = None
    if kind == "text_data":
        text = msg.text_data
        if content_type is None or is_json_content_type(content_type):
            data = _loads_data(
                text.encode(), where, content_type or "application/json", "text_data"
            )
            attrs.setdefault("datacontenttype", "application/json")
        else:
            data = text.encode()
    elif kind == "binary_data":
        raw = msg.binary_data
        data = (
            _loads_data(raw, where, content_type, "binary_data")
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


def events_from_proto_batch(batch: pb.CloudEventBatch) -> list[CloudEvent]:
    """Decode every event of a batch; an error names the index (``batch[3]: ...``)."""
    return [event_from_proto(m, f"batch[{i}]") for i, m in enumerate(batch.events)]
