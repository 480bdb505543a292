"""The join bridge on the session's broker and Redis: a source of a group with no live member
consumes by assignment while its group join runs (Tansu holds a join for half the session
timeout), from the group's committed offsets, and hands over to its group member without
losing or repeating an event; a second member that starts meanwhile joins after the hand-over
and the group splits the partitions. The mechanism runs on either broker; the controller
opens bridges on Tansu only (Apache Kafka answers a first join at once)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from eventbus._internal import keys
from eventbus._internal.redis_client import connect
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.serving._bridge import RedisJoinBridge, broker_holds_joins, open_bridges
from tests.integration.test_kafka_source import (
    committed_offsets,
    make_source,
    produce,
    read_all,
    wait_for,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.redis,
    pytest.mark.tansu,  # the embedded default's set: also run on Tansu (make test)
]


async def commit(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})
    finally:
        await consumer.stop()


def bridged_source(bootstrap: str, src: str, out: str, group: str, redis_url: str, **kw: Any):
    seen: list[tuple[str, bool]] = []  # (event id, whether the bridge consumer fetched it)

    async def dispatch(events: list[CloudEvent]) -> list[Outcome]:
        await asyncio.sleep(kw.pop("delay_s", 0.0))
        seen.extend((e.id, source._fetcher.bridging) for e in events)
        return [[e] for e in events]

    holder = f"{uuid.uuid4().hex[:6]}/0"
    source = make_source(
        bootstrap,
        src,
        dispatch,
        out,
        None,
        pipeline=f"p-{holder[:6]}",
        group=group,
        fetch={"bridge": RedisJoinBridge(redis_url, group, holder), **kw.get("fetch", {})},
    )
    return source, seen


def ns_of(records: list[Any]) -> list[int]:
    return [orjson.loads(r.value)["n"] for r in records]


# a held first join (Tansu): on Apache Kafka the member takes over before a bridge is seen
@pytest.mark.tansu_only
async def test_bridge_starts_from_the_committed_offsets_and_hands_over_once(
    kafka_bootstrap, topic_factory, redis_url
):
    src, out = topic_factory("in", partitions=2), topic_factory("out")
    group = f"g-{src}"
    await produce(
        kafka_bootstrap, src, [(i % 2, None, orjson.dumps({"n": i}), []) for i in range(400)]
    )
    # an earlier life of the group delivered the first 100 records of each partition
    await commit(kafka_bootstrap, group, {TopicPartition(src, p): 100 for p in range(2)})
    redis = connect(redis_url, decode_responses=True)
    open_bridges(redis, [group])
    source, seen = bridged_source(kafka_bootstrap, src, out, group, redis_url)
    await source.start()
    runner = asyncio.create_task(source.run())
    try:
        assert source._fetcher.bridging, "an open bridge was not taken"
        assert redis.get(keys.join_bridge(group)) not in (None, "open")
        await wait_for(lambda: len(seen) >= 200, 30, lambda: str(source.stats()))
        assert seen[0][1], "the first records waited for the group join"
        await wait_for(lambda: not source._fetcher.bridging, 30, lambda: "the hand-over")
        # what the bridge consumer delivered was committed by the group member at the hand-over
        await wait_for(lambda: source.stats()["committed"] >= 200, 30, lambda: str(source.stats()))
        await wait_for(
            lambda: redis.get(keys.join_bridge(group)) is None, 30, lambda: "the bridge's release"
        )
        assert source._fetcher.consumer.assignment() == {TopicPartition(src, p) for p in range(2)}
        await produce(
            kafka_bootstrap,
            src,
            [(i % 2, None, orjson.dumps({"n": i}), []) for i in range(400, 600)],
        )
        await wait_for(lambda: source.stats()["committed"] >= 400, 30, lambda: str(source.stats()))
    finally:
        await source.stop()
        await runner
    got = ns_of(await read_all(kafka_bootstrap, out, 400))
    assert sorted(got) == list(range(200, 600)), "not each record past the commits exactly once"
    assert not all(bridged for _, bridged in seen), "the group member fetched nothing"
    assert await committed_offsets(kafka_bootstrap, group, src, 2) == {0: 300, 1: 300}


# a held first join (Tansu): on Apache Kafka the member takes over before a bridge is seen
@pytest.mark.tansu_only
async def test_a_second_member_waits_for_the_hand_over_and_the_group_splits(
    kafka_bootstrap, topic_factory, redis_url
):
    n, partitions = 500, 4
    src, out = topic_factory("in", partitions=partitions), topic_factory("out")
    group = f"g-{src}"
    events = [(i % partitions, None, orjson.dumps({"n": i}), []) for i in range(n)]
    await produce(kafka_bootstrap, src, events)
    open_bridges(connect(redis_url, decode_responses=True), [group])
    opts = {"delay_s": 0.02, "fetch": {"max_batch": 100}}
    a, seen_a = bridged_source(kafka_bootstrap, src, out, group, redis_url, **opts)
    b, seen_b = bridged_source(kafka_bootstrap, src, out, group, redis_url, **opts)

    async def go(source: Any) -> asyncio.Task[None]:
        await source.start()  # the one that did not take the bridge joins after its hand-over
        return asyncio.create_task(source.run())

    started = [asyncio.create_task(go(s)) for s in (a, b)]
    await wait_for(lambda: any(t.done() for t in started), 30, lambda: "a start")
    runs = [t.result() for t in started if t.done()]
    try:
        assert a._fetcher.bridging != b._fetcher.bridging, "not exactly one took the bridge"
        runs = list(await asyncio.gather(*started))
        more = [(i % partitions, None, orjson.dumps({"n": i}), []) for i in range(n, 2 * n)]
        await produce(kafka_bootstrap, src, more)  # while the bridge and the join run

        def split() -> bool:
            owned = [s._fetcher.consumer.assignment() for s in (a, b)]
            return all(owned) and not owned[0] & owned[1] and len(owned[0] | owned[1]) == partitions

        await wait_for(split, 60, lambda: "both members to own partitions")
        await wait_for(
            lambda: a.stats()["committed"] + b.stats()["committed"] >= 2 * n,
            60,
            lambda: f"a={a.stats()} b={b.stats()}",
        )
    finally:
        await asyncio.gather(a.stop(), b.stop())
        await asyncio.gather(*runs)
    got = Counter(ns_of(await read_all(kafka_bootstrap, out, 2 * n)))
    assert set(got) == set(range(2 * n)), "events were lost"
    repeated = {k: c for k, c in got.items() if c > 1}
    assert not repeated, f"{len(repeated)} events delivered twice"
    assert seen_a and seen_b, "one member consumed nothing"
    assert await committed_offsets(kafka_bootstrap, group, src, partitions) == dict.fromkeys(
        range(partitions), 2 * n // partitions
    )


async def test_only_an_open_bridge_is_taken_and_only_its_holder_releases_it(redis_url):
    group = f"g-{uuid.uuid4().hex[:8]}"
    redis = connect(redis_url, decode_responses=True)
    first, second = (RedisJoinBridge(redis_url, group, h) for h in ("r1/0", "r2/0"))
    assert not await first.claim(), "a bridge the controller never opened was taken"
    assert not await first.wait_clear(1.0), "waited for no bridge"
    open_bridges(redis, [group])
    assert 0 < redis.ttl(keys.join_bridge(group)) <= 120
    taken = await asyncio.gather(first.claim(), second.claim())
    assert sorted(taken) == [False, True], "not exactly one claim"
    holder, other = (first, second) if taken[0] else (second, first)
    assert redis.get(keys.join_bridge(group)) == holder.holder
    await other.release()  # not its own: the bridge stays
    assert redis.get(keys.join_bridge(group)) == holder.holder
    waiter = asyncio.create_task(other.wait_clear(10.0))
    with pytest.raises(TimeoutError):  # held: still waiting
        await asyncio.wait_for(asyncio.shield(waiter), 0.3)
    await holder.release()
    assert await waiter is True, "the other source did not wait for the release"
    assert redis.get(keys.join_bridge(group)) is None


# a held first join (Tansu): on Apache Kafka the member takes over before a bridge is seen
@pytest.mark.tansu_only
async def test_a_bridge_whose_holder_died_delays_the_join_only_until_it_expires(
    kafka_bootstrap, topic_factory, redis_url
):
    src, out = topic_factory("in"), topic_factory("out")
    group = f"g-{src}"
    await produce(kafka_bootstrap, src, [(0, None, orjson.dumps({"n": i}), []) for i in range(50)])
    redis = connect(redis_url, decode_responses=True)
    redis.set(keys.join_bridge(group), "gone-replica/0", px=1500)  # its holder was killed
    source, seen = bridged_source(kafka_bootstrap, src, out, group, redis_url)
    await source.start()  # waits for the dead holder's bridge to expire, then joins
    runner = asyncio.create_task(source.run())
    try:
        assert not source._fetcher.bridging and redis.get(keys.join_bridge(group)) is None
        await wait_for(lambda: source.stats()["committed"] >= 50, 30, lambda: str(source.stats()))
    finally:
        await source.stop()
        await runner
    assert sorted(ns_of(await read_all(kafka_bootstrap, out, 50))) == list(range(50))
    assert not any(bridged for _, bridged in seen)


async def test_the_controller_bridges_joins_on_tansu_only(kafka_bootstrap, broker_kind):
    """Tansu reports its default cluster id and holds a first join; Apache Kafka (the stack's
    group.initial.rebalance.delay.ms=0) answers one in tens of ms: no bridge there."""
    held = await asyncio.to_thread(broker_holds_joins, kafka_bootstrap, None)
    assert held is (broker_kind == "tansu")
