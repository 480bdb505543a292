"""The join bridge's hand-over without a broker: the member commits what the bridge delivered
through aiokafka's public ``commit()`` (stand-ins with no private attributes: a use of one
fails here), only the partitions it owns; and a hand-over whose commit fails in any way still
hands over, so the source never stays ``bridging`` with every later commit held."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiokafka import TopicPartition

from eventbus.eventing.sources import FetchSettings, KafkaSource, KafkaSourceConfig, SourceSinks
from eventbus.eventing.sources._kafka_batch import KafkaBatch
from eventbus.testing import ListSink

P0, P1, P2 = (TopicPartition("in", p) for p in range(3))


class StandInMember:
    """A group member as the hand-over uses it: public methods only (``__slots__``: reading
    any other attribute, ``_coordinator`` say, is an AttributeError)."""

    __slots__ = ("commits", "owned", "seeks")

    def __init__(self, owned: set[TopicPartition]) -> None:
        self.owned = owned
        self.commits: list[dict[TopicPartition, int]] = []
        self.seeks: list[tuple[TopicPartition, ...]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.owned)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        assert set(offsets) <= self.owned, "aiokafka refuses a partition not assigned"
        self.commits.append(dict(offsets))

    async def seek_to_committed(self, *tps: TopicPartition) -> None:
        self.seeks.append(tps)


class StandInBridge:
    __slots__ = ("stopped",)

    def __init__(self) -> None:
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


def bridged_source() -> tuple[KafkaSource, StandInMember, StandInBridge]:
    async def dispatch(events: list[Any]) -> list[Any]:
        return [[e] for e in events]

    source = KafkaSource(
        KafkaSourceConfig(topic="in"),
        pipeline="p",
        bootstrap_servers="127.0.0.1:1",
        dispatch=dispatch,
        sinks=SourceSinks(ListSink()),
        fetch=FetchSettings(),
    )
    member, bridge = StandInMember({P0, P1}), StandInBridge()
    fetcher = source._fetcher
    fetcher._group, fetcher.consumer = member, bridge  # type: ignore[assignment]
    return source, member, bridge


def held(source: KafkaSource, offsets: dict[TopicPartition, int]) -> None:
    batch = KafkaBatch(seq=1, count=3, events=[], records=[], dead=[], offsets=offsets)
    source._commits.add(batch)  # held: the bridge fetches


def test_the_member_commits_through_its_public_commit_only_what_it_owns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, member, bridge = bridged_source()
    assert source._fetcher.bridging
    held(source, {P0: 10, P1: 4, P2: 7})
    with caplog.at_level(logging.WARNING):
        asyncio.run(source._on_bridged())
    assert member.commits == [{P0: 10, P1: 4}]
    assert "in[2], which its group member does not own" in caplog.text
    assert not source._fetcher.bridging and bridge.stopped
    assert source._fetcher.consumer is member and member.seeks == [tuple(member.assignment())]


@pytest.mark.parametrize("error", [AttributeError("'X' has no attribute '_x'"), RuntimeError("?")])
def test_a_hand_over_whose_commit_fails_still_hands_over_and_holds_nothing(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    source, member, bridge = bridged_source()
    held(source, {P0: 10})

    async def broken(offsets: dict[TopicPartition, int]) -> None:
        raise error

    source._fetcher.commit_as_member = broken  # type: ignore[method-assign]

    async def run() -> None:
        await source._on_bridged()
        assert not source._fetcher.bridging, "left bridging: every commit would be held"
        assert bridge.stopped and source._fetcher.consumer is member
        # commits are not held any more: the next batch goes through the member's consumer
        source._commits.add(
            KafkaBatch(seq=2, count=1, events=[], records=[], dead=[], offsets={P1: 5})
        )
        await asyncio.wait_for(source._commits.flush(), 5)

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    assert "the join bridge's hand-over commit failed; handing over without it" in caplog.text
    assert member.commits == [{P1: 5}]
