"""The doorbell's decisions without a broker: which parked sources to ring and which entries
are stale (the ringer and the parked sources on a real stack: tests/integration/
test_scale_to_zero.py)."""

from __future__ import annotations

import json

from eventbus.serving._doorbell import STALE_S, _partitions, due_rings


def entry(ends: dict[str, int], at: float = 1000.0) -> str:
    return json.dumps({"ends": ends, "at": at})


def test_a_parked_source_is_rung_when_a_partition_end_moves_past_what_it_saw() -> None:
    parked = {
        "r1/0": entry({"a[0]": 10, "a[1]": 4}),
        "r2/0": entry({"b[0]": 7}),
        "r3/0": entry({"c[0]": -1}),  # never fetched: any record rings it
        "r4/0": entry({"d[0]": -1}),
    }
    # Tansu's ListOffsets: the last batch's base offset + 1 (below the true end 10 of a[0])
    ends = {"a[0]": 3, "a[1]": 5, "b[0]": 7, "c[0]": 2, "d[0]": 0}
    ring, stale = due_rings(parked, ends, now=1001.0)
    assert ring == ["r1/0", "r3/0"] and stale == []


def test_stale_and_malformed_entries_are_dropped_not_rung() -> None:
    parked = {
        "old/0": entry({"a[0]": 0}, at=1000.0 - STALE_S - 1),
        "bad/0": "{not json",
        "half/0": json.dumps({"ends": {"a[0]": 0}}),
    }
    ring, stale = due_rings(parked, {"a[0]": 9}, now=1000.0)
    assert ring == [] and sorted(stale) == ["bad/0", "half/0", "old/0"]


def test_the_partitions_of_every_parked_source_once() -> None:
    parked = {
        "r1/0": entry({"orders[0]": 1, "orders[1]": 2}),
        "r2/0": entry({"orders[1]": 2, "eventbus-ingress-x[0]": 0}),
        "bad/0": "[]",
    }
    assert _partitions(parked) == {("orders", 0), ("orders", 1), ("eventbus-ingress-x", 0)}
