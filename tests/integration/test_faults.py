"""Fault injection on the real stack: each test pushes 20,000 events with unique ids, breaks
something mid-run, and checks that the sink holds every expected event exactly once (count
and id set) and, where promised, in per-key order.

kill -9 a pipeline replica; kill -9 a source actor; restart Redis; a function raising on 1%
of the events. (The gateway killed mid-burst is in test_gateway.py.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
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

N = 20_000
KEYS = 40


def doc(
    name: str,
    src: str,
    sink: str,
    dlq: str,
    *,
    placement: str = "replica",
    steps: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": src}}],
            "steps": steps
            if steps is not None
            else [{"id": "tag", "convert": {"set": {"data.seen": "true"}}}],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "delivery": {"dedupe": {"window_s": 600}},
            "serving": {
                "replicas": 1,
                "batch": {"max_size": 500, "linger_ms": 5},
                "source_placement": placement,
            },
        },
    }


async def produce_paced(
    bootstrap: str, topic: str, n: int, seconds: float, progress: list[int]
) -> None:
    """n events with keys k0..k39 and a per-key sequence, spread over ``seconds``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)
    await producer.start()
    try:
        seq: Counter[str] = Counter()
        chunk = 200
        start = time.monotonic()
        for base in range(0, n, chunk):
            futs = []
            for i in range(base, min(n, base + chunk)):
                key = f"k{i % KEYS}"
                seq[key] += 1
                e = CloudEvent.create(
                    type="f.test",
                    source="/faults",
                    id=f"f{i}",
                    data={"n": i, "key": key, "seq": seq[key]},
                    partitionkey=key,
                )
                headers, value = encode_kafka_binary(e)
                futs.append(await producer.send(topic, value, key=key.encode(), headers=headers))
            await asyncio.gather(*futs)
            progress[0] = min(n, base + chunk)
            due = start + seconds * progress[0] / n
            if due > time.monotonic():
                await asyncio.sleep(
                    due - time.monotonic()
                )  # pacing the producer, not waiting for a result
    finally:
        await producer.stop()


def check_exactly_once_in_key_order(events: list[CloudEvent], expected_ids: set[str]) -> None:
    """Every expected id exactly once, nothing else, in per-key order."""
    counts = Counter(e.id for e in events)
    dups = {k: c for k, c in counts.items() if c > 1}
    assert not dups, f"{len(dups)} duplicated ids, e.g. {list(dups.items())[:5]}"
    assert set(counts) == expected_ids, (
        f"missing {len(expected_ids - set(counts))}, unexpected {len(set(counts) - expected_ids)}"
    )
    by_key: dict[str, list[int]] = defaultdict(list)
    first: set[str] = set()
    for e in events:
        if e.id in first:
            continue
        first.add(e.id)
        by_key[e.data["key"]].append(e.data["seq"])
    for key, seqs in by_key.items():
        assert seqs == sorted(seqs), f"order broken for {key}"


def replica_pid(name: str) -> int:
    from ray import serve

    return int(serve.get_app_handle(f"eventbus-{name}").stats.remote().result(timeout_s=60)["pid"])


def source_actor_pid(name: str) -> int:
    import ray

    actor = ray.get_actor(f"eventbus-source-{name}-0", namespace="eventbus")
    return int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60))


async def run_with_fault(
    bootstrap: str, src: str, sink: str, fault: Any, expected: set[str]
) -> list[CloudEvent]:
    progress = [0]
    producer = asyncio.create_task(produce_paced(bootstrap, src, N, 6.0, progress))
    while progress[0] < N * 0.4:
        await asyncio.sleep(0.05)
    await asyncio.to_thread(fault)
    await producer
    return await collect(bootstrap, sink, len(expected), timeout_s=180)


@pytest.mark.tansu  # the embedded default's kill test: also run on Tansu (make test)
@pytest.mark.parametrize("placement", ["replica", "actor"])
async def test_kill_9_mid_run_loses_and_duplicates_nothing(
    placement: str, deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str
) -> None:
    src, sink, dlq = (
        topic_factory("f-in", partitions=4),
        topic_factory("f-out", partitions=4),
        topic_factory("f-dlq"),
    )
    name = f"fault-{placement}-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(doc(name, src, sink, dlq, placement=placement))
    pid_of = replica_pid if placement == "replica" else source_actor_pid
    victim = await asyncio.to_thread(pid_of, name)
    out = await run_with_fault(
        kafka_bootstrap,
        src,
        sink,
        lambda: os.kill(victim, signal.SIGKILL),
        {f"f{i}" for i in range(N)},
    )
    check_exactly_once_in_key_order(out, {f"f{i}" for i in range(N)})
    assert all(e.data["seen"] is True for e in out)
    # the process really died and another took over
    assert await asyncio.to_thread(pid_of, name) != victim


@pytest.mark.parametrize(
    ("placement", "point"), [("replica", "after-sink-ack"), ("actor", "after-claim")]
)
async def test_death_inside_the_dedupe_window(
    placement: str,
    point: str,
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    faults_dir: Path,
) -> None:
    """The process that sends the outputs dies exactly between the sink's acknowledgement and
    the dedupe mark (or between the claim and the send): the next owner finds the batch's
    outputs pending, searches the sink, and sends exactly the missing ones."""
    src, sink, dlq = (
        topic_factory("w-in", partitions=4),
        topic_factory("w-out", partitions=4),
        topic_factory("w-dlq"),
    )
    name = f"window-{placement}-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(doc(name, src, sink, dlq, placement=placement))
    pid_of = replica_pid if placement == "replica" else source_actor_pid
    victim = await asyncio.to_thread(pid_of, name)
    trigger = faults_dir / f"{name}.{point}"
    out = await run_with_fault(
        kafka_bootstrap, src, sink, trigger.touch, {f"f{i}" for i in range(N)}
    )
    assert not trigger.exists(), "the fault did not fire"
    check_exactly_once_in_key_order(out, {f"f{i}" for i in range(N)})
    assert await asyncio.to_thread(pid_of, name) != victim


async def test_redis_restart_mid_run(
    redis_server: Any,
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    eventbus_client: Any,
) -> None:
    src, sink, dlq = (
        topic_factory("r-in", partitions=4),
        topic_factory("r-out", partitions=4),
        topic_factory("r-dlq"),
    )
    name = f"fault-redis-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(doc(name, src, sink, dlq))
    out = await run_with_fault(
        kafka_bootstrap, src, sink, redis_server.restart, {f"f{i}" for i in range(N)}
    )
    check_exactly_once_in_key_order(out, {f"f{i}" for i in range(N)})
    assert eventbus_client.get(name)["name"] == name  # the controller's state survived (AOF)


async def test_function_raising_on_one_percent_dead_letters_exactly_those(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str
) -> None:
    src, sink, dlq = (
        topic_factory("p-in", partitions=4),
        topic_factory("p-out", partitions=4),
        topic_factory("p-dlq"),
    )
    name = f"fault-poison-{uuid.uuid4().hex[:6]}"
    steps = [{"id": "check", "function": "tests.integration.funcs:fails_one_percent", "retries": 1}]
    d = doc(name, src, sink, dlq, steps=steps)
    d["spec"]["delivery"]["backoff"] = {"initial_ms": 10, "max_ms": 50}
    deploy_pipeline(d)
    bad = {f"f{i}" for i in range(N) if i % 100 == 42}
    good = {f"f{i}" for i in range(N)} - bad
    progress = [0]
    await produce_paced(kafka_bootstrap, src, N, 2.0, progress)
    out, dead = await asyncio.gather(
        collect(kafka_bootstrap, sink, len(good), timeout_s=180),
        collect(kafka_bootstrap, dlq, len(bad), timeout_s=180),
    )
    check_exactly_once_in_key_order(out, good)
    assert all(e.data["ok"] for e in out)
    assert Counter(e.id for e in dead) == Counter(bad)
    for e in dead:
        assert e["ebstep"] == "check" and e["eberrortype"] == "RuntimeError"
        assert e["eberror"] == f"refusing n={e.data['n']}" and int(e["ebattempts"]) == 2
        assert e["ebtopic"] == src and int(e["eboffset"]) >= 0
