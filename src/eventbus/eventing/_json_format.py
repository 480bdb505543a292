"""The CloudEvents JSON event format: one event (structured mode) and the batch format, read
and written with orjson (the HTTP and gRPC codecs and the Kafka binding build on it)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from eventbus.errors import EventDecodeError
from eventbus.eventing._event import CloudEvent, is_json_content_type
from eventbus.eventing._event_checks import (
    _DUMPS,
    Where,
    _fail,
    _shown,
    _validate,
    check_json_depth,
)

__all__ = ["event_from_json", "event_to_json", "events_from_json_batch"]


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
