"""The schedule source on the real stack: each tick emitted once across replicas, a replica's
kill -9 and restarts (state in the real Redis, ticks through the real broker)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from datetime import datetime
from typing import Any

import pytest

from eventbus import CloudEvent
from eventbus._internal import keys
from eventbus._internal.redis_client import connect, connect_async
from eventbus.eventing.sinks._kafka import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources._schedule import ScheduleRunner
from eventbus.eventing.sources._schedule_config import ScheduleSourceConfig
from tests.integration.kafka_helpers import collect

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.redis]


def _ms(e: CloudEvent) -> int:
    return round(datetime.fromisoformat(e.time.replace("Z", "+00:00")).timestamp() * 1000)  # type: ignore[union-attr]


def check_each_tick_once(events: list[CloudEvent], through_ms: int, every_ms: int) -> int:
    """Every tick from the first seen up to ``through_ms`` exactly once; returns how many."""
    counts = Counter(_ms(e) for e in events)
    dups = {t: c for t, c in counts.items() if c > 1}
    assert not dups, f"ticks emitted more than once: {sorted(dups.items())[:5]}"
    assert all(e.id == e.time for e in events)  # the tick time is the event's id and time
    first = min(counts)
    expected = set(range(first, through_ms + 1, every_ms))
    got = {t for t in counts if t <= through_ms}
    assert got == expected, f"missing ticks {sorted(expected - got)[:5]}"
    return len(expected)


async def _wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_runners_share_each_tick_across_stops_and_restarts(
    redis_url: str, kafka_bootstrap: str, topic_factory: Any
) -> None:
    topic = topic_factory("sched")
    pipeline = f"sched-{uuid.uuid4().hex[:6]}"
    config = ScheduleSourceConfig(every_s=1, name="tick", data={"job": "x"})
    redis = connect_async(redis_url)
    sink = KafkaSink(KafkaSinkConfig(topic=topic), bootstrap_servers=kafka_bootstrap)
    await sink.start()
    state = keys.schedule(pipeline, "tick")

    def start(owner: str) -> tuple[ScheduleRunner, asyncio.Event, asyncio.Task[None]]:
        runner = ScheduleRunner(config, pipeline=pipeline, redis=redis, sink=sink, owner=owner)
        stop = asyncio.Event()
        return runner, stop, asyncio.create_task(runner.run(stop))

    async def emitted_at_least(n: int) -> bool:
        return int(await redis.hget(state, "emitted") or 0) >= n

    try:
        a, b = start("a"), start("b")
        await _wait_for(lambda: emitted_at_least(2), 15, "two ticks")
        assert a[0].holding != b[0].holding  # one holder at a time
        holder, other = (a, b) if a[0].holding else (b, a)
        holder[1].set()  # a stop gives the lease back: the other takes over at once
        await holder[2]
        await _wait_for(lambda: emitted_at_least(4), 15, "ticks after the holder stopped")
        assert other[0].holding
        restarted = start("a-restarted")  # a restart: a new process identity
        other[1].set()
        await other[2]
        await _wait_for(lambda: emitted_at_least(6), 15, "ticks after the restart")
        assert restarted[0].holding
        restarted[1].set()
        await restarted[2]
        through = int(await redis.hget(state, "through"))
        emitted = int(await redis.hget(state, "emitted"))
        events = await collect(kafka_bootstrap, topic, emitted, timeout_s=30)
        assert check_each_tick_once(events, through, 1000) == emitted == len(events)
        assert int(await redis.hget(state, "missed") or 0) == 0
        assert (
            events[0].data == {"job": "x"}
            and events[0].source == f"/eventbus/{pipeline}/schedules/tick"
        )
        assert await redis.ttl(state) > 86400  # the state expires when no replica runs it
    finally:
        await sink.stop()
        await redis.delete(state)
        await redis.aclose()


@pytest.mark.ray
async def test_schedule_fires_once_per_tick_across_two_replicas_and_a_kill_9(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, redis_url: str
) -> None:
    sink = topic_factory("sched-out")
    name = f"sched-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"schedule": {"every_s": 1, "name": "beat", "data": {"n": 1}}}],
                "steps": [{"id": "mark", "convert": {"set": {"data.seen": "true"}}}],
                "sink": {"kafka": {"topic": sink}},
                "delivery": {"dedupe": {"window_s": 600}},
                "serving": {"replicas": 2, "batch": {"linger_ms": 5}},
            },
        }
    )
    redis = connect(redis_url)
    state = keys.schedule(name, "beat")

    async def owner_pid() -> int:
        return int((redis.hget(state, b"owner") or b"x:0:x").split(b":")[1])

    async def emitted() -> int:
        return int(redis.hget(state, "emitted") or 0)

    try:
        await _wait_for(lambda: _gte(emitted, 3), 60, "three ticks")
        victim = await owner_pid()
        before = await emitted()
        os.kill(victim, signal.SIGKILL)  # the holder dies; Serve restarts a replica
        await _wait_for(lambda: _ne(owner_pid, victim, 0), 30, "another replica taking the lease")
        await _wait_for(lambda: _gte(emitted, before + 3), 30, "ticks after the takeover")
        through = int(redis.hget(state, "through"))
        total = await emitted()
        out = await collect(kafka_bootstrap, sink, total, timeout_s=60)
        assert check_each_tick_once(out, through, 1000) == total
        assert all(e.data == {"n": 1, "seen": True} and e.type == "eventbus.schedule" for e in out)
        # and the scheduler itself wrote each tick once to the ingress topic
        ingress = await collect(kafka_bootstrap, f"eventbus-ingress-{name}", total, timeout_s=30)
        assert check_each_tick_once(ingress, through, 1000) == total
        assert int(redis.hget(state, "missed") or 0) == 0  # late ticks, within the grace
    finally:
        redis.delete(state)
        redis.close()


async def _gte(value: Any, n: int) -> bool:
    return bool(await value() >= n)


async def _ne(value: Any, a: int, b: int) -> bool:
    v = await value()
    return bool(v not in (a, b))
