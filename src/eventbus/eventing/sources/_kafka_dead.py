"""Dead-letter events of the Kafka source: the failed input plus the ``eb*`` attributes.

``ebpipeline``, ``ebstep``, ``eberrortype``, ``eberror``, ``ebattempts``, ``ebtopic``,
``ebpartition``, ``eboffset`` on every dead letter; a dead letter the dead-letter sink refused
(too large) goes again cut down, with ``ebtruncated`` (why) and ``ebsize`` (the data's
original size in bytes).
"""

from __future__ import annotations

from typing import Any

import orjson

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure

__all__ = ["TRUNCATED_DATA_BYTES", "dead_letter_event", "truncated_dead_letter"]


def dead_letter_event(
    original: CloudEvent, pipeline: str, failure: Failure, topic: str, partition: int, offset: int
) -> CloudEvent:
    """The dead-letter event of a failed input: the original plus the ``eb*`` attributes."""
    return original.replace(
        ebpipeline=pipeline,
        ebstep=failure.step,
        eberrortype=failure.error_type,
        eberror=failure.message,
        ebattempts=failure.attempts,
        ebtopic=topic,
        ebpartition=partition,
        eboffset=offset,
    )


#: Data bytes a truncated dead letter keeps (its original is too large for the sink).
TRUNCATED_DATA_BYTES = 64 * 1024
#: Characters kept of each ``eb*`` text attribute of a truncated dead letter.
_TRUNCATED_TEXT = 1000
_KEPT_ATTRIBUTES = frozenset(("specversion", "id", "source", "type", "subject", "time"))


def truncated_dead_letter(dead: CloudEvent, problem: tuple[str, str]) -> CloudEvent:
    """A dead letter the sink refused (too large, say) cut down to what surely fits.

    Keeps the event's identity (``id``, ``source``, ``type``, ``subject``, ``time``) and its
    ``eb*`` attributes (texts cut to 1,000 characters), and the first
    :data:`TRUNCATED_DATA_BYTES` of its data as bytes; ``ebtruncated`` says why
    (``Type: message``) and ``ebsize`` the data's original size in bytes.
    """
    attrs: dict[str, Any] = {}
    for name, value in dead.attributes.items():
        if name in _KEPT_ATTRIBUTES:
            attrs[name] = value
        elif name.startswith("eb"):
            attrs[name] = value[:_TRUNCATED_TEXT] if isinstance(value, str) else value
    data = dead.data
    if data is None:
        raw = b""
    elif isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
    else:
        try:
            raw = orjson.dumps(data)
        except TypeError:
            raw = repr(data).encode()
    attrs["datacontenttype"] = "application/octet-stream"
    attrs["ebtruncated"] = f"{problem[0]}: {problem[1]}"[:_TRUNCATED_TEXT]
    attrs["ebsize"] = len(raw)
    return CloudEvent(attrs, raw[:TRUNCATED_DATA_BYTES])
