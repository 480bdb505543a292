"""An idle Kafka source long-polls: its fetch wait grows once no record came for a while and
goes back to the low-latency wait with the first records (no broker: a stand-in consumer)."""

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
