"""The source↔replica batch wire format round-trips every kind of event and outcome."""

from __future__ import annotations

from eventbus import CloudEvent, Failure
from eventbus.serving._wire import pack_events, pack_outcomes, unpack_events, unpack_outcomes


def test_json_batches_round_trip() -> None:
    events = [CloudEvent.create(type="t", source="/s", id=str(i), data={"n": i, "f": 1.5, "l": [None, True]}) for i in range(5)]
    blob = pack_events(events)
    assert blob[:1] == b"J"
    assert unpack_events(blob) == events


def test_bytes_data_and_big_ints_fall_back_to_pickle() -> None:
    events = [CloudEvent.create(type="t", source="/s", id="1", data=b"\x00\xff"), CloudEvent.create(type="t", source="/s", id="2", data={"n": 2**70})]
    blob = pack_events(events)
    assert blob[:1] == b"P"
    assert unpack_events(blob) == events


def test_outcomes_round_trip() -> None:
    e = CloudEvent.create(type="t", source="/s", id="1", data={"a": 1})
    outcomes = [[e, e], [], Failure(step="s", error_type="ValueError", message="bad", attempts=2)]
    assert unpack_outcomes(pack_outcomes(outcomes)) == outcomes  # type: ignore[arg-type]
