"""The doorbell's decisions without a broker: which parked sources to ring and which entries
are stale (the ringer and the parked sources on a real stack: tests/integration/
test_scale_to_zero.py)."""

from __future__ import annotations

import json
from typing import Any

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


class _Redis:
    """The few sync Redis calls the ringer makes, in memory (hashes and published messages)."""

    def __init__(self, parked: dict[str, str] | None = None) -> None:
        self.parked = dict(parked or {})
        self.published: list[str] = []
        self.reads = 0

    def hgetall(self, key: str) -> dict[str, str]:
        self.reads += 1
        return dict(self.parked)

    def hdel(self, key: str, *fields: str) -> None:
        for f in fields:
            self.parked.pop(f, None)

    def pipeline(self, transaction: bool = False) -> _Redis:
        return self

    def publish(self, channel: str, message: str) -> None:
        self.published.append(channel)

    def execute(self) -> None:
        pass


class _Look:
    """The ringer's look at the ends (a broker's answers the test sets)."""

    def __init__(self, ends: dict[str, int]) -> None:
        self.ends_now = ends
        self.asked: list[set[tuple[str, int]]] = []

    def ends(self, partitions: set[tuple[str, int]]) -> dict[str, int]:
        self.asked.append(set(partitions))
        return {k: v for k, v in self.ends_now.items() if _split(k) in partitions}


def _split(name: str) -> tuple[str, int]:
    topic, _, part = name.rpartition("[")
    return topic, int(part.rstrip("]"))


class _Zero:
    def __init__(self, marks: dict[str, dict[tuple[str, int], int]]) -> None:
        self.marks = marks
        self.nudged: list[str] = []
        self.looks: list[tuple[list[str], float]] = []

    def wake_marks(self) -> dict[str, dict[tuple[str, int], int]]:
        return self.marks

    def nudge(self, name: str) -> None:
        self.nudged.append(name)

    def looked(self, names: Any, every_s: float) -> None:
        self.looks.append((sorted(names), every_s))


def test_the_ringer_nudges_the_watcher_once_when_records_wait_for_a_pipeline_at_zero() -> None:
    import time

    from eventbus.serving._doorbell import ZERO_LOOK_S, Ringer

    zero = _Zero({"p1": {("t1", 0): 5, ("t1", 1): 0}, "p2": {("t2", 0): 3}})
    ringer = Ringer(_Redis(), "b:9092", None, zero=zero)
    look = ringer._looker = _Look({"t1[0]": 5, "t1[1]": 0, "t2[0]": 3})
    assert ringer.tick() is False and zero.nudged == []  # nothing parked, no lag
    assert look.asked == [{("t1", 0), ("t1", 1), ("t2", 0)}], "one look for every pipeline"
    assert zero.looks == [(["p1", "p2"], ZERO_LOOK_S)], "the watcher is told it looked"
    del look.ends_now["t2[0]"]  # a partition without a leader (a topic deleted, recreated)
    ringer._zero_at = time.monotonic() - 1
    ringer.tick()
    assert zero.looks[-1] == (["p1"], ZERO_LOOK_S), (
        "p2 was not looked at whole: the watcher reads it"
    )
    look.ends_now["t2[0]"] = 3
    look.ends_now["t1[1]"] = 1  # a record for p1
    ringer._zero_at = time.monotonic() - 1
    ringer.tick()
    ringer._zero_at = time.monotonic() - 1
    ringer.tick()
    assert zero.nudged == ["p1"], "nudged once for the same committed offsets"
    zero.marks["p1"] = {("t1", 0): 5, ("t1", 1): 1}  # it woke, consumed, went back to zero
    ringer._zero_at = time.monotonic() - 1
    ringer.tick()
    look.ends_now["t1[0]"] = 9
    ringer._zero_at = time.monotonic() - 1
    ringer.tick()
    assert zero.nudged == ["p1", "p1"] and ringer.nudges == 2


def test_the_ringer_looks_at_parked_and_zero_partitions_together_and_rings_once() -> None:
    import time

    from eventbus.serving._doorbell import Ringer

    redis = _Redis({"r1/0": entry({"a[0]": 4}, at=time.time())})
    zero = _Zero({"p": {("z", 0): 2}})
    ringer = Ringer(redis, "b:9092", None, zero=zero)
    look = ringer._looker = _Look({"a[0]": 4, "z[0]": 2})
    assert ringer.tick() is True  # something is parked: the next look in RING_EVERY_S
    assert look.asked[-1] == {("a", 0), ("z", 0)}
    look.ends_now["a[0]"] = 5
    ringer.tick()
    ringer.tick()
    assert redis.published == ["eventbus:doorbell:r1/0"], "rung once for one park"
    assert redis.reads == 1, "the parked entries are read once a second, not at every look"


def test_wake_marks_cover_pipelines_at_zero_after_their_drain_on_the_stacks_kafka() -> None:
    import time

    from eventbus.serving._scale_to_zero import SETTLE_S, ScaleToZero, Watched

    watcher = ScaleToZero(None, lambda *a: None, "b:9092", None)
    now = time.time()
    at_zero = Watched("p", {"b:9092": {"g1": ["t"], "g2": ["t"]}}, {}, idle_s=5, poll_s=1)
    at_zero.zero_since, at_zero.committed_read_at = now - 2 * SETTLE_S, now
    at_zero.fetched = {"g1/t[0]": 7, "g2/t[0]": 4, "g1/t[1]": 2}
    draining = Watched("d", {"b:9092": {"g": ["u"]}}, {}, idle_s=5, poll_s=1)
    draining.zero_since, draining.committed_read_at = now, now  # read before the drain ended
    draining.fetched = {"g/u[0]": 1}
    elsewhere = Watched("e", {"other:9092": {"g": ["v"]}}, {}, idle_s=5, poll_s=1)
    elsewhere.zero_since, elsewhere.committed_read_at = now - 2 * SETTLE_S, now
    elsewhere.fetched = {"g/v[0]": 1}
    running = Watched("r", {"b:9092": {"g": ["w"]}}, {}, idle_s=5, poll_s=1)
    running.fetched = {"g/w[0]": 1}
    for w in (at_zero, draining, elsewhere, running):
        watcher._watched[w.name] = w
    assert watcher.wake_marks() == {"p": {("t", 0): 4, ("t", 1): 2}}
    watcher.nudge("p")
    watcher.nudge("deleted-meanwhile")
    assert at_zero.nudged and at_zero.next_at == 0.0


def test_the_look_at_pipelines_at_zero_slows_with_their_partitions_up_to_a_second() -> None:
    """What the looks cost (per partition, at the broker and in the ringer) stays bounded as
    pipelines go to zero; the detection of a cold start waits longer, never past poll_s."""
    from eventbus.serving._doorbell import ZERO_LOOK_MAX_S, ZERO_LOOK_S, zero_look_every

    assert zero_look_every(0) == zero_look_every(80) == ZERO_LOOK_S
    assert zero_look_every(200) == 0.5
    assert zero_look_every(10_000) == ZERO_LOOK_MAX_S == 1.0
    looks = [n / zero_look_every(n) for n in (100, 200, 400, 10_000)]
    assert max(looks[:3]) == min(looks[:3]) == 400, "partitions looked at a second: bounded"
