"""The aggregate step on the real stack (Tansu, Redis with its append-only file, Ray Serve):
tumbling and session windows over many keys with event times out of order, against an answer
the test computes itself, through a crash between a batch's state update and its commit, a
replica killed with SIGKILL and a Redis restart; closed windows run through the steps after
the aggregate (in process with the sources on the replicas; by a call to a replica from a
source actor); late events land in the dead-letter topic.

Sizing: 30,000 events over 1,000 keys (the issue's 200,000 would take minutes of CPU on the
2-core CI machine for no more proof). Each fault hits a pipeline mid-stream, while its replica
merges batches continuously; the crash point ``aggregate-applied`` (right after a batch's
state update, before its commit) makes the replay deterministic, and ``duplicate_events``
shows it was absorbed. 30 events per key spread over 10 minutes of event time give ~10
tumbling windows and several sessions per key: ~10,000 windows per pipeline to compare.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from aiokafka import AIOKafkaProducer

from eventbus import CloudEvent
from eventbus._internal import keys
from eventbus.eventing._codecs import encode_kafka_binary
from tests.integration.kafka_helpers import collect

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]

N, KEYS = 30_000, 1_000
SPAN_MS, DISORDER_MS = 600_000, 30_000  # event times over 10 minutes, up to 30 s out of order
SIZE_S, GAP_S = 60, 10
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000
STEP = "per_key"


def doc(
    name: str, topic: str, sink: str, dlq: str, window: dict[str, Any], placement: str
) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": topic}}],
            "steps": [
                {
                    "id": STEP,
                    "aggregate": {
                        "key": "data.k",
                        "window": window,
                        "allowed_lateness_s": 600,
                        "aggregations": {"n": "count", "total": {"sum": "data.amount"}},
                    },
                },
                # closed windows run through the later steps like any output
                {"id": "mark", "convert": {"set": {"data.via": "'mark'"}}},
            ],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "delivery": {"dedupe": {"window_s": 600}},
            "serving": {
                "replicas": 1,
                "batch": {"max_size": 1000, "linger_ms": 5},
                "source_placement": placement,
            },
        },
    }


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def make_events() -> list[CloudEvent]:
    rnd = random.Random(22)
    out = []
    for i in range(N):
        t = max(T0, T0 + i * SPAN_MS // N - rnd.randrange(DISORDER_MS))
        data = {"k": f"k{rnd.randrange(KEYS)}", "amount": rnd.randrange(1, 1000)}
        out.append(CloudEvent.create(type="m", source="/agg", id=f"e{i}", time=iso(t), data=data))
    return out


def tumbling_answer(evs: list[CloudEvent]) -> dict[tuple[str, int], tuple[int, int]]:
    got: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for e in evs:
        t = ms(e["time"])
        w = got[(e.data["k"], t - t % (SIZE_S * 1000))]
        w[0] += 1
        w[1] += e.data["amount"]
    return {k: (n, s) for k, (n, s) in got.items()}


def session_answer(evs: list[CloudEvent]) -> dict[tuple[str, int], tuple[int, int]]:
    per_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in evs:
        per_key[e.data["k"]].append((ms(e["time"]), e.data["amount"]))
    out = {}
    for k, rows in per_key.items():
        rows.sort()
        start, last, n, total = rows[0][0], rows[0][0], 0, 0
        for t, amount in rows:
            if t - last >= GAP_S * 1000:
                out[(k, start)] = (n, total)
                start, n, total = t, 0, 0
            last, n, total = t, n + 1, total + amount
        out[(k, start)] = (n, total)
    return out


async def produce(
    bootstrap: str, topic: str, evs: list[CloudEvent], progress: list[int], key: bytes | None
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for base in range(0, len(evs), 1000):
            futs = []
            for e in evs[base : base + 1000]:
                headers, value = encode_kafka_binary(e)
                futs.append(await producer.send(topic, value, headers=headers, key=key))
            await asyncio.gather(*futs)
            progress[0] += len(futs)
            await asyncio.sleep(0.02)  # a stream, not one burst: the faults land mid-run
    finally:
        await producer.stop()


def replica_pid(name: str) -> int:
    from ray import serve

    return int(serve.get_app_handle(f"eventbus-{name}").stats.remote().result(timeout_s=60)["pid"])


def step_figure(client: redis.Redis, name: str, figure: str) -> int:
    total = 0
    for raw in client.hgetall(keys.stats(name)).values():
        steps = json.loads(raw).get("metrics", {}).get("steps", {})
        total += int(steps.get(STEP, {}).get("stats", {}).get(figure, 0))
    return total


async def wait_for(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(cond):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.2)


def check(out: list[CloudEvent], expect: dict[tuple[str, int], tuple[int, int]]) -> None:
    got: dict[tuple[str, int], tuple[int, int]] = {}
    for e in out:
        assert e.data["via"] == "mark", e.data  # the convert after the aggregate ran
        k = (e.data["key"], ms(e.data["window_start"]))
        assert k not in got, f"window {k} emitted twice"
        got[k] = (e.data["n"], e.data["total"])
    missing = expect.keys() - got.keys()
    assert not missing, f"{len(missing)} windows missing, e.g. {sorted(missing)[:3]}"
    wrong = {k: (got[k], v) for k, v in expect.items() if got[k] != v}
    assert not wrong, f"{len(wrong)} windows differ (got, expected), e.g. {list(wrong.items())[:3]}"
    assert len(got) == len(expect)


async def test_tumbling_and_session_windows_exactly_once_through_crashes(
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    redis_server: Any,
    redis_url: str,
    faults_dir: Path,
) -> None:
    topic = topic_factory("agg-in", partitions=4)
    run = uuid.uuid4().hex[:6]
    # the session pipeline's source runs as an actor: its closed windows go through the
    # replica's later steps by a call (process_after), the tumbling one's in process
    pipes = {
        "tumbling": (f"aggt-{run}", {"tumbling": {"size_s": SIZE_S}}, "replica"),
        "session": (f"aggs-{run}", {"session": {"gap_s": GAP_S}}, "actor"),
    }
    sinks = {kind: topic_factory(f"agg-{kind}", partitions=2) for kind in pipes}
    dlqs = {kind: topic_factory(f"agg-{kind}-dlq") for kind in pipes}
    for kind, (name, window, placement) in pipes.items():
        deploy_pipeline(doc(name, topic, sinks[kind], dlqs[kind], window, placement))
    evs = make_events()
    victim = await asyncio.to_thread(replica_pid, pipes["session"][0])
    progress = [0]

    async def faults() -> None:
        async def at(share: float) -> None:
            while progress[0] < N * share:
                await asyncio.sleep(0.02)

        await at(0.25)  # the tumbling replica dies right after a batch's state update
        (faults_dir / f"{pipes['tumbling'][0]}.aggregate-applied").touch()
        await at(0.45)
        os.kill(victim, signal.SIGKILL)
        await at(0.7)
        await asyncio.to_thread(redis_server.restart)

    await asyncio.gather(produce(kafka_bootstrap, topic, evs, progress, None), faults())
    client = redis.Redis.from_url(redis_url)
    seen = {kind: keys.aggregate_keys(name, STEP)[5] for kind, (name, *_) in pipes.items()}
    # every event applied once (the state remembers each applied event's id)
    await wait_for(
        lambda: all(client.zcard(k) == N for k in seen.values()), 150, "all events applied"
    )
    # a watermark far ahead (one partition: after every event) closes every window
    end = CloudEvent.create(
        type="m", source="/agg", id="end", time=iso(T0 + 86_400_000), data={"k": "~", "amount": 0}
    )
    await produce(kafka_bootstrap, topic, [end], [0], b"end")
    answers = {"tumbling": tumbling_answer(evs), "session": session_answer(evs)}
    for kind, answer in answers.items():
        out = await collect(kafka_bootstrap, sinks[kind], len(answer), timeout_s=90)
        check(out, answer)
    assert not (faults_dir / f"{pipes['tumbling'][0]}.aggregate-applied").exists()
    assert await asyncio.to_thread(replica_pid, pipes["session"][0]) != victim
    await wait_for(
        lambda: step_figure(client, pipes["tumbling"][0], "duplicate_events") > 0,
        30,
        "the replayed batch to be absorbed as duplicates",
    )
    # events later than allowed_lateness_s (their windows closed) go to the dead letters
    late = [
        CloudEvent.create(
            type="m",
            source="/agg",
            id=f"late{i}",
            time=iso(T0 - 3_600_000),
            data={"k": "k1", "amount": 1},
        )
        for i in range(3)
    ]
    await produce(kafka_bootstrap, topic, late, [0], b"end")
    for kind, (name, *_) in pipes.items():
        dead = await collect(kafka_bootstrap, dlqs[kind], 3, timeout_s=30)
        assert sorted(d.id for d in dead) == ["late0", "late1", "late2"]
        for d in dead:
            assert d["eberrortype"] == "AggregateLateEventError" and d["ebstep"] == STEP
            assert "allowed_lateness_s (600 s)" in d["eberror"]
        await wait_for(lambda n=name: step_figure(client, n, "late_events") >= 3, 30, "late count")
    client.close()
