"""The batch wire format between a source actor and a pipeline replica.

Ray pickles call arguments; a list of 2,000 :class:`CloudEvent` objects costs ~10 µs per
event each way that way, while one ``bytes`` blob of JSON crosses for ~2.7 µs per event
(orjson) and Ray passes bytes without copying them through pickle. Batches that JSON cannot
hold (``bytes`` data, integers past 64 bits) fall back to pickle, marked by the first byte.
"""

from __future__ import annotations

import pickle
from typing import Any

import orjson

from eventbus.eventing._codecs import KafkaRecord, RawRecord
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure, Outcome

__all__ = [
    "pack_encoded_outcomes",
    "pack_events",
    "pack_outcomes",
    "pack_records",
    "unpack_encoded_outcomes",
    "unpack_events",
    "unpack_outcomes",
    "unpack_records",
]

_JSON = b"J"
_PICKLE = b"P"


def _pack(obj: Any) -> bytes:
    try:
        return _JSON + orjson.dumps(obj)
    except TypeError:
        return _PICKLE + pickle.dumps(obj, protocol=5)


def _unpack(blob: bytes) -> Any:
    kind, body = blob[:1], memoryview(blob)[1:]
    if kind == _JSON:
        return orjson.loads(body)
    if kind == _PICKLE:
        return pickle.loads(body)  # noqa: S301 - our own replicas' output
    msg = f"unknown batch encoding {kind!r}; source and replica run different EventBus versions"
    raise ValueError(msg)


def pack_events(events: list[CloudEvent]) -> bytes:
    """A batch of events as one blob."""
    return _pack([(e.attributes, e.data) for e in events])


def unpack_events(blob: bytes) -> list[CloudEvent]:
    """The events of a blob from :func:`pack_events`."""
    return [CloudEvent(a, d) for a, d in _unpack(blob)]


def pack_outcomes(outcomes: list[Outcome]) -> bytes:
    """Outcomes as one blob: a list of output lists, a failure as a 4-item dict."""
    wire: list[Any] = []
    for o in outcomes:
        if type(o) is list:
            wire.append([(e.attributes, e.data) for e in o])
        else:
            f: Failure = o  # type: ignore[assignment]
            wire.append({"step": f.step, "error_type": f.error_type, "message": f.message, "attempts": f.attempts})
    return _pack(wire)


def unpack_outcomes(blob: bytes) -> list[Outcome]:
    """Outcomes from a blob of :func:`pack_outcomes`."""
    out: list[Outcome] = []
    for o in _unpack(blob):
        if type(o) is list:
            out.append([CloudEvent(a, d) for a, d in o])
        else:
            out.append(Failure(**o))
    return out


# -- raw records in, encoded records out (decode and encode on the replica) --------------------
# Plain tuples pickle fastest; RawRecord and KafkaRecord are rebuilt on arrival.


def pack_records(records: list[RawRecord]) -> bytes:
    """Undecoded Kafka records as one blob."""
    return pickle.dumps([tuple(r) for r in records], protocol=5)


def unpack_records(blob: bytes) -> list[RawRecord]:
    """The records of a blob from :func:`pack_records`."""
    return [RawRecord(*r) for r in pickle.loads(blob)]  # noqa: S301 - from our own source actor


def pack_encoded_outcomes(outcomes: list[list[KafkaRecord] | Failure]) -> bytes:
    """Outcomes whose outputs are encoded records, as one blob."""
    wire: list[Any] = []
    for o in outcomes:
        if type(o) is list:
            wire.append([tuple(r) for r in o])
        else:
            f: Failure = o  # type: ignore[assignment]
            wire.append((f.step, f.error_type, f.message, f.attempts))
    return pickle.dumps(wire, protocol=5)


def unpack_encoded_outcomes(blob: bytes) -> list[Outcome]:
    """Outcomes from :func:`pack_encoded_outcomes`; outputs are :class:`KafkaRecord`."""
    out: list[Any] = []
    for o in pickle.loads(blob):  # noqa: S301 - from our own replicas
        if type(o) is list:
            out.append([KafkaRecord(*r) for r in o])
        else:
            out.append(Failure(*o))
    return out
