"""The source-actor ↔ replica wire format round-trips records and outcomes."""

from __future__ import annotations

from eventbus import Failure
from eventbus.eventing._codecs import KafkaRecord, RawRecord
from eventbus.serving._wire import (
    pack_encoded_outcomes,
    pack_records,
    unpack_encoded_outcomes,
    unpack_records,
)


def test_records_round_trip() -> None:
    records = [
        RawRecord(b'{"a": 1}', [("ce_id", b"1")], b"k", "t", 2, 7),
        RawRecord(None, [], None, "t", 0, 8),
    ]
    assert unpack_records(pack_records(records)) == records


def test_encoded_outcomes_round_trip() -> None:
    out = [
        [KafkaRecord([("ce_id", b"1")], b"{}", None), KafkaRecord([], None, b"k")],
        [],
        Failure("s", "ValueError", "bad", 2),
    ]
    back = unpack_encoded_outcomes(pack_encoded_outcomes(out))  # type: ignore[arg-type]
    assert back == out
    assert type(back[0][0]) is KafkaRecord  # type: ignore[index]
