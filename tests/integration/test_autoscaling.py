"""Autoscaling on the real stack: a pipeline whose replicas fall behind (an I/O-bound step,
a burst on its topic) scales up on consumer lag, then back down once the backlog is gone."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from eventbus import CloudEvent
from eventbus.eventing._codecs import encode_kafka_binary
from tests.integration.kafka_helpers import collect

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]

N = 6000


def replica_count(name: str) -> int:
    from ray import serve

    app = serve.status().applications.get(f"eventbus-{name}")
    if app is None or "pipeline" not in app.deployments:
        return 0
    return sum(
        n
        for state, n in app.deployments["pipeline"].replica_states.items()
        if str(state).endswith("RUNNING")
    )


async def wait_for(cond: Any, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if await asyncio.to_thread(cond):
            return time.monotonic() - start
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


async def produce(bootstrap: str, topic: str, n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futs = []
        for i in range(n):
            headers, value = encode_kafka_binary(
                CloudEvent.create(
                    type="a.test", source="/autoscale", id=f"a{i}", data={"n": i, "wait_ms": 5}
                )
            )
            futs.append(
                await producer.send(topic, value, key=str(i % 16).encode(), headers=headers)
            )
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


async def test_scales_up_on_lag_and_back_down(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str
) -> None:
    src, sink = topic_factory("as-in", partitions=4), topic_factory("as-out", partitions=2)
    name = f"autoscale-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [{"id": "wait", "function": "tests.integration.funcs:io_wait"}],
                "sink": {"kafka": {"topic": sink}},
                "serving": {
                    "replicas": {"min": 1, "max": 3},
                    "batch": {"max_size": 200, "linger_ms": 5, "max_in_flight": 2},
                    "autoscaling": {
                        "target_lag": 1000,
                        "look_back_s": 2,
                        "upscale_delay_s": 0,
                        "downscale_delay_s": 3,
                        "capacity_events_per_s": 1e6,  # this test scales on lag alone
                    },
                },
            },
        }
    )
    assert replica_count(name) == 1
    # 6,000 events at 5 ms each: 30 s of work for one replica, a lag of thousands
    await produce(kafka_bootstrap, src, N)
    up_s = await wait_for(lambda: replica_count(name) >= 2, 60, "a scale-up on lag")
    out = await collect(kafka_bootstrap, sink, N, timeout_s=60)
    assert {e.id for e in out} == {f"a{i}" for i in range(N)}
    # generous: Serve decides at its control loop's pace, which a loaded machine slows (a CI
    # run took over 40 s once); the property is that it scales down, not how fast
    down_s = await wait_for(
        lambda: replica_count(name) == 1, 120, "the scale-down once the backlog is gone"
    )
    print(f"scaled up after {up_s:.1f} s, back down {down_s:.1f} s after the backlog was delivered")
