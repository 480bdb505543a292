"""Consumers take a partition's records only up to a gap in their offsets (Tansu can store
concurrent producers' batches out of order) and fetch again from the gap."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from eventbus.eventing.sources import KafkaSource, KafkaSourceConfig, SourceSinks
from eventbus.eventing.sources._kafka_gaps import OffsetGaps

TP = TopicPartition("in", 0)
OTHER = TopicPartition("in", 1)


class Consumer:
    def __init__(self) -> None:
        self.seeks: list[tuple[TopicPartition, int]] = []

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))


def recs(*offsets: int) -> list[Any]:
    return [SimpleNamespace(offset=o) for o in offsets]


def take(
    gaps: OffsetGaps,
    c: Consumer,
    data: dict[TopicPartition, list[Any]],
    now: float,
    tp: TopicPartition = TP,
) -> tuple[list[int], bool]:
    out, held = gaps.take(c, data, now)
    return [r.offset for r in out.get(tp, [])], held


def test_contiguous_records_pass():
    g, c = OffsetGaps(1.0, "t"), Consumer()
    assert take(g, c, {TP: recs(0, 1, 2)}, 0.0) == ([0, 1, 2], False)
    assert take(g, c, {TP: recs(3, 4)}, 0.1) == ([3, 4], False)
    assert c.seeks == []


def test_records_after_a_gap_wait_until_it_fills():
    g, c = OffsetGaps(1.0, "t"), Consumer()
    take(g, c, {TP: recs(0, 1)}, 0.0)
    # offsets 2-3 are reserved but not stored yet: 4-5 came first; the other partition goes on
    data = {TP: recs(4, 5), OTHER: recs(7, 8)}
    assert take(g, c, data, 0.1) == ([], True)
    assert take(g, c, {OTHER: recs(9)}, 0.1, OTHER) == ([9], False)
    assert c.seeks == [(TP, 2)]
    # a gap inside one fetch: the records before it are taken
    assert take(g, c, {TP: recs(2, 4, 5)}, 0.2) == ([2], True)
    assert c.seeks[-1] == (TP, 3)
    # the gap filled
    assert take(g, c, {TP: recs(3, 4, 5)}, 0.3) == ([3, 4, 5], False)
    assert len(c.seeks) == 2


def test_a_gap_that_stays_is_passed_after_the_wait():
    g, c = OffsetGaps(0.5, "t"), Consumer()
    take(g, c, {TP: recs(10)}, 0.0)
    assert take(g, c, {TP: recs(12, 13)}, 1.0) == ([], True)
    assert take(g, c, {TP: recs(12, 13)}, 1.4) == ([], True)
    assert take(g, c, {TP: recs(12, 13)}, 1.6) == ([12, 13], False)  # 0.6 s > 0.5 s
    assert c.seeks == [(TP, 11), (TP, 11)]


def test_zero_wait_passes_gaps_and_reset_forgets_positions():
    g, c = OffsetGaps(0.0, "t"), Consumer()
    take(g, c, {TP: recs(0)}, 0.0)
    assert take(g, c, {TP: recs(5)}, 0.0) == ([5], False)
    g = OffsetGaps(1.0, "t")
    take(g, c, {TP: recs(0)}, 0.0)
    g.reset()  # as after a rebalance: positions go back to the committed offsets
    assert take(g, c, {TP: recs(5, 6)}, 0.1) == ([5, 6], False)
    assert c.seeks == []


def test_the_source_waits_as_configured():
    config = KafkaSourceConfig(topic="in", offset_gap_wait_ms=250)
    source = KafkaSource(
        config,
        pipeline="p",
        bootstrap_servers="127.0.0.1:1",
        dispatch=None,  # type: ignore[arg-type]
        sinks=SourceSinks(sink=None),  # type: ignore[arg-type]
    )
    assert source._fetcher.gaps.wait_s == 0.25
    # unset: the broker decides at start (Tansu 1 s, Apache Kafka 0: see eventing._broker)
    assert KafkaSourceConfig(topic="in").offset_gap_wait_ms is None
