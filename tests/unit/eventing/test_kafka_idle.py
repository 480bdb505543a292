"""An idle Kafka source long-polls: its fetch wait grows once no record came for a while and
goes back to the low-latency wait with the first records; with a doorbell it parks instead
(no fetch until it rings, the stop or a failed doorbell ends the park) (no broker: a stand-in
consumer)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from eventbus.eventing.sources import KafkaSourceConfig
from eventbus.eventing.sources._kafka_fetch import IDLE_AFTER_S, KafkaFetcher
from eventbus.eventing.sources._kafka_settings import FetchSettings

TP = TopicPartition("in", 0)


class _Fetcher:  # aiokafka's Fetcher: only the attribute the source switches
    def __init__(self, wait_ms: int) -> None:
        self._fetch_max_wait_ms = wait_ms


class StandInConsumer:
    """Answers ``getmany`` from a script: a list of record counts, one per call (0: none)."""

    def __init__(self, script: list[int], wait_ms: int) -> None:
        self.script = list(script)
        self._fetcher = _Fetcher(wait_ms)
        self.timeouts: list[int] = []
        self.waits: list[int] = []  # the fetch wait in force at each call
        self.offset = 0

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        self.timeouts.append(timeout_ms)
        self.waits.append(self._fetcher._fetch_max_wait_ms)
        n = self.script.pop(0) if self.script else 0
        recs = [
            ConsumerRecord("in", 0, self.offset + i, 0, 0, None, b"{}", None, 0, 0, ())
            for i in range(n)
        ]
        self.offset += n
        return {TP: recs} if recs else {}


def test_an_idle_source_long_polls_and_the_first_records_end_it() -> None:
    config = KafkaSourceConfig(topic="in", fetch_max_wait_ms=10, idle_fetch_max_wait_ms=700)
    fetcher = KafkaFetcher(
        config, FetchSettings(linger_ms=0), pipeline="p", group="g", bootstrap_servers="x"
    )
    fetcher._tansu = True  # the wait is switched on Tansu only (it holds a waiting fetch)
    consumer = StandInConsumer([3], config.fetch_max_wait_ms)
    now = [1000.0]

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.time = lambda: now[0]  # type: ignore[method-assign]
        assert await fetcher.fetch(consumer)  # type: ignore[arg-type]
        assert not fetcher.idle
        now[0] += IDLE_AFTER_S / 2
        assert await fetcher.fetch(consumer) == {}  # type: ignore[arg-type]
        assert not fetcher.idle, "idle too early"
        now[0] += IDLE_AFTER_S
        assert await fetcher.fetch(consumer) == {}  # type: ignore[arg-type]
        assert fetcher.idle
        assert consumer._fetcher._fetch_max_wait_ms == 700
        consumer.script = [5]
        assert await fetcher.fetch(consumer)  # type: ignore[arg-type]
        assert not fetcher.idle
        assert consumer._fetcher._fetch_max_wait_ms == 10

    asyncio.run(run())
    # getmany itself waits longer while idle (fewer wake-ups), 100 ms while records flow
    assert consumer.timeouts == [100, 100, 100, 700]
    assert consumer.waits == [10, 10, 10, 700]


def test_the_idle_fetch_wait_may_not_be_shorter_than_the_busy_one() -> None:
    expect = "idle_fetch_max_wait_ms (5) is shorter than fetch_max_wait_ms (10); make it at least as long"
    with pytest.raises(ValueError, match=re.escape(expect)):
        KafkaSourceConfig(topic="in", fetch_max_wait_ms=10, idle_fetch_max_wait_ms=5)


class ParkingConsumer(StandInConsumer):
    """The stand-in with an assignment, pause/resume and the high watermark of its fetches."""

    def __init__(self, script: list[int], wait_ms: int) -> None:
        super().__init__(script, wait_ms)
        self.paused: set[Any] = set()
        self.assigned = {TP}
        self.pauses = 0

    def assignment(self) -> set[Any]:
        return set(self.assigned)

    def pause(self, *tps: Any) -> None:
        self.pauses += 1
        self.paused |= set(tps)

    def resume(self, *tps: Any) -> None:
        self.paused -= set(tps)

    def highwater(self, tp: Any) -> int:
        return self.offset

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        assert not self.paused, "fetched while parked"
        return await super().getmany(timeout_ms=timeout_ms, max_records=max_records)


class Bell:
    """A doorbell the test rings; ``fail`` makes it raise (Redis refuses pub/sub)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[dict[str, int]] = []
        self.ring = asyncio.Event()

    async def wait(self, ends: Any) -> None:
        self.seen.append(dict(ends))
        if self.fail:
            raise ConnectionError("NOPERM this user has no permissions to access a channel")
        await self.ring.wait()
        self.ring.clear()


def _parking(bell: Bell) -> tuple[KafkaFetcher, ParkingConsumer]:
    config = KafkaSourceConfig(topic="in", fetch_max_wait_ms=10, idle_fetch_max_wait_ms=700)
    fetcher = KafkaFetcher(
        config,
        FetchSettings(linger_ms=0, doorbell=bell),
        pipeline="p",
        group="g",
        bootstrap_servers="x",
    )
    fetcher._tansu = True  # the doorbell and the wait switch are Tansu's
    return fetcher, ParkingConsumer([3], config.fetch_max_wait_ms)


def test_an_idle_source_with_a_doorbell_parks_without_fetching_until_it_rings() -> None:
    bell = Bell()
    fetcher, consumer = _parking(bell)

    async def run() -> None:
        assert await fetcher.fetch(consumer)  # type: ignore[arg-type]
        fetcher._last_records_at -= IDLE_AFTER_S  # no record since
        assert await fetcher.fetch(consumer) == {}  # type: ignore[arg-type]
        assert fetcher.idle
        # parked: every partition paused (the stand-in fails a fetch while paused)
        parked = asyncio.create_task(fetcher.fetch(consumer))  # type: ignore[arg-type]
        while not bell.seen:
            await asyncio.sleep(0)
        assert consumer.paused == {TP} and bell.seen == [{"in[0]": 3}]
        consumer.script = [2]  # records came: the ring resumes and fetches at once
        bell.ring.set()
        got = await asyncio.wait_for(parked, 5)
        assert sum(len(r) for r in got.values()) == 2
        assert not fetcher.idle and consumer.paused == set()

    asyncio.run(run())
    # parked, the fetch wait stays the low-latency one; after a ring getmany waits for the
    # records it was rung for (returning as soon as they come)
    assert consumer.waits == [10, 10, 10]
    assert consumer.timeouts == [100, 100, 300]
    assert fetcher.parks == 1


def test_stopping_ends_a_park_at_once() -> None:
    bell = Bell()
    fetcher, consumer = _parking(bell)

    async def run() -> None:
        fetcher.idle = True
        parked = asyncio.create_task(fetcher.fetch(consumer))  # type: ignore[arg-type]
        while not bell.seen:
            await asyncio.sleep(0)
        fetcher.unpark()  # KafkaSource.stop() calls it
        await asyncio.wait_for(parked, 1)
        assert consumer.paused == set()
        await asyncio.wait_for(fetcher.fetch(consumer), 1)  # type: ignore[arg-type]
        assert fetcher.parks == 1, "parked again after unpark()"

    asyncio.run(run())


def test_a_failing_doorbell_is_dropped_for_the_long_poll() -> None:
    bell = Bell(fail=True)
    fetcher, consumer = _parking(bell)
    consumer.script = []

    async def run() -> None:
        fetcher.idle = True
        assert await asyncio.wait_for(fetcher.fetch(consumer), 1) == {}  # type: ignore[arg-type]
        assert consumer._fetcher._fetch_max_wait_ms == 700, "no long poll after the failure"
        assert await fetcher.fetch(consumer) == {}  # type: ignore[arg-type]

    asyncio.run(run())
    assert len(bell.seen) == 1, "the failed doorbell was used again"
    assert consumer.paused == set()
    assert consumer.timeouts == [700, 700]


def test_on_apache_kafka_every_fetch_long_polls_and_nothing_is_switched() -> None:
    """Apache Kafka answers a waiting fetch when records arrive: the consumer is made with the
    idle wait, and going idle or busy touches no aiokafka internals."""
    config = KafkaSourceConfig(topic="in", fetch_max_wait_ms=10, idle_fetch_max_wait_ms=700)
    fetcher = KafkaFetcher(
        config, FetchSettings(linger_ms=0), pipeline="p", group="g", bootstrap_servers="x"
    )
    assert fetcher._consumer_kwargs()["fetch_max_wait_ms"] == 700
    consumer = StandInConsumer([3], 700)
    fetcher._set_idle(consumer, True)  # type: ignore[arg-type]
    fetcher._set_idle(consumer, False)  # type: ignore[arg-type]
    assert consumer._fetcher._fetch_max_wait_ms == 700
    fetcher._tansu = True
    assert fetcher._consumer_kwargs()["fetch_max_wait_ms"] == 10
