"""While a join bridge fetches, delivered batches wait for the hand-over: nothing is committed
through the bridge's consumer (the group refuses a non-member's commit once it has a member),
``flush`` does not spin on them, and ``commit_held`` commits every partition through the
member, counted once (no broker: a stand-in consumer)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition

from eventbus.eventing.sources._kafka_batch import KafkaBatch
from eventbus.eventing.sources._kafka_commit import Committer
from eventbus.observability._metrics import LATENCY_BOUNDS_S, Histogram

P0, P1 = TopicPartition("in", 0), TopicPartition("in", 1)


class StandInConsumer:
    def __init__(self) -> None:
        self.commits: list[dict[Any, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return {P0, P1}

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.commits.append(dict(offsets))


def batch(seq: int, offsets: dict[Any, int], count: int) -> KafkaBatch:
    return KafkaBatch(seq=seq, count=count, events=[], records=[], dead=[], offsets=offsets)


def test_held_batches_wait_for_the_hand_over_and_go_through_the_member() -> None:
    consumer, held, stats = StandInConsumer(), [True], {"committed": 0}
    committer = Committer(
        lambda: consumer,  # type: ignore[arg-type, return-value]
        "p",
        stats,
        Histogram(LATENCY_BOUNDS_S),
        hold=lambda: held[0],
    )
    through_member: list[dict[Any, int]] = []

    async def member_commit(offsets: dict[TopicPartition, int]) -> None:
        through_member.append(dict(offsets))

    async def run() -> None:
        committer.add(batch(1, {P0: 10}, 10))
        committer.add(batch(2, {P0: 15, P1: 4}, 9))
        await asyncio.wait_for(committer.flush(), 1.0)  # returns: held batches do not spin
        assert consumer.commits == [] and stats["committed"] == 0
        held[0] = False  # the hand-over: the member commits what the bridge delivered
        await committer.commit_held(member_commit)
        assert through_member == [{P0: 15, P1: 4}]
        assert committer.committed == {P0: 15, P1: 4} and stats["committed"] == 19
        committer.add(batch(3, {P1: 9}, 5))  # after the hand-over: the usual commits
        await committer.flush()
        assert consumer.commits == [{P1: 9}] and stats["committed"] == 24
        await committer.commit_held(member_commit)  # nothing left: no second commit
        assert len(through_member) == 1

    asyncio.run(run())
