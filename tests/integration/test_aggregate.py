"""The aggregate step on the real stack (Tansu, Redis with its append-only file, Ray Serve):
tumbling and session windows over many keys with event times out of order, against an answer
the test computes itself, through a crash between a batch's state update and its commit, a
replica killed with SIGKILL and a Redis restart, and (a test of its own) a redeploy while
events flow; closed windows run through the steps after
the aggregate (in process with the sources on the replicas; by a call to a replica from a
source actor); late events land in the dead-letter topic.

Sizing: the issue's 200,000 events over 1,000 keys, produced once in bulk (4 partitions) and
consumed by both pipelines at the same time (53 s for this test on the shared 2-core machine at
a load average of 3-12). Each fault hits a pipeline mid-stream (gated on the events its state
has applied), while its replica merges batches continuously; the crash point
``aggregate-applied`` (right after a batch's state update, before its commit) makes the replay
deterministic, and ``duplicate_events`` shows it was absorbed. The events spread over 10
minutes of event time, up to 30 s out of order: 10 tumbling windows per key (~10,000 to
compare) and several sessions per key.
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

from eventbus._internal import keys
from tests.integration.bulk_kafka import Record, ce_record, collect_data, produce_bulk
from tests.integration.kafka_helpers import collect

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
    # ~90 s (join) and ~55 s (aggregate) here; a machine shared with other jobs takes 2-3x
    pytest.mark.timeout(600),
]

#: The issue's size (see the module's docstring).
N = 200_000
KEYS, PARTITIONS = 1_000, 4
SPAN_MS, DISORDER_MS = 600_000, 30_000  # event times over 10 minutes, up to 30 s out of order
SIZE_S, GAP_S = 60, 10
#: the bulk input is read faster than real time: the wall clock moves the watermark on a little
#: while the events' own times stand still, so the lateness allowed is well above that drift
LATENESS_S = 3600
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
                        "allowed_lateness_s": LATENESS_S,
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


#: One input event: its key, its event time (ms) and its amount.
Row = tuple[str, int, int]


def make_rows() -> list[Row]:
    rnd = random.Random(22)
    out = []
    for i in range(N):
        t = max(T0, T0 + i * SPAN_MS // N - rnd.randrange(DISORDER_MS))
        out.append((f"k{rnd.randrange(KEYS)}", t, rnd.randrange(1, 1000)))
    return out


def records(rows: list[Row]) -> dict[int, list[Record]]:
    """The rows as CloudEvents ``e<i>``, round-robin over the partitions (in time order each,
    give or take the disorder)."""
    parts: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    for i, (k, t, amount) in enumerate(rows):
        data = {"k": k, "amount": amount}
        parts[i % PARTITIONS].append(ce_record("m", "/agg", f"e{i}", data, iso(t)))
    return parts


def tumbling_answer(rows: list[Row]) -> dict[tuple[str, int], tuple[int, int]]:
    got: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for k, t, amount in rows:
        w = got[(k, t - t % (SIZE_S * 1000))]
        w[0] += 1
        w[1] += amount
    return {k: (n, s) for k, (n, s) in got.items()}


def session_answer(rows: list[Row]) -> dict[tuple[str, int], tuple[int, int]]:
    per_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for k, t, amount in rows:
        per_key[k].append((t, amount))
    out = {}
    for k, times in per_key.items():
        times.sort()
        start, last, n, total = times[0][0], times[0][0], 0, 0
        for t, amount in times:
            if t - last >= GAP_S * 1000:
                out[(k, start)] = (n, total)
                start, n, total = t, 0, 0
            last, n, total = t, n + 1, total + amount
        out[(k, start)] = (n, total)
    return out


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


def check(out: list[tuple[bytes, Any]], expect: dict[tuple[str, int], tuple[int, int]]) -> None:
    got: dict[tuple[str, int], tuple[int, int]] = {}
    for _, data in out:
        assert data["via"] == "mark", data  # the convert after the aggregate ran
        k = (data["key"], ms(data["window_start"]))
        assert k not in got, f"window {k} emitted twice"
        got[k] = (data["n"], data["total"])
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
    t0 = time.monotonic()

    def phase(what: str) -> None:
        print(f"aggregate ({N} events): {what} {time.monotonic() - t0:.1f} s")

    topic = topic_factory("agg-in", partitions=PARTITIONS)
    run = uuid.uuid4().hex[:6]
    # the session pipeline's source runs as an actor: its closed windows go through the
    # replica's later steps by a call (process_after), the tumbling one's in process
    pipes = {
        "tumbling": (f"aggt-{run}", {"tumbling": {"size_s": SIZE_S}}, "replica"),
        "session": (f"aggs-{run}", {"session": {"gap_s": GAP_S}}, "actor"),
    }
    sinks = {kind: topic_factory(f"agg-{kind}", partitions=2) for kind in pipes}
    dlqs = {kind: topic_factory(f"agg-{kind}-dlq") for kind in pipes}
    await asyncio.gather(
        *(
            asyncio.to_thread(
                deploy_pipeline, doc(name, topic, sinks[kind], dlqs[kind], window, placement)
            )
            for kind, (name, window, placement) in pipes.items()
        )
    )
    phase("deployed")
    rows = make_rows()
    victim = await asyncio.to_thread(replica_pid, pipes["session"][0])
    client = redis.Redis.from_url(redis_url)
    seen = {kind: keys.aggregate_keys(name, STEP)[5] for kind, (name, *_) in pipes.items()}

    def applied(kind: str, share: float) -> bool:
        """The state has applied ``share`` of the events (it keeps each applied event's id)."""
        return int(client.zcard(seen[kind])) >= N * share

    async def faults() -> None:
        # the tumbling replica dies right after a batch's state update
        await wait_for(lambda: applied("tumbling", 0.25), 120, "25% applied (tumbling)")
        (faults_dir / f"{pipes['tumbling'][0]}.aggregate-applied").touch()
        phase("tumbling crash armed")
        await wait_for(lambda: applied("session", 0.45), 120, "45% applied (session)")
        os.kill(victim, signal.SIGKILL)
        phase("session replica killed")
        await wait_for(
            lambda: applied("tumbling", 0.7) or applied("session", 0.7), 120, "70% applied"
        )
        phase("redis restart")
        await asyncio.to_thread(redis_server.restart)
        phase("redis restarted")

    await asyncio.gather(produce_bulk(kafka_bootstrap, topic, records(rows)), faults())
    phase("produced")
    # every event applied once
    await wait_for(lambda: applied("tumbling", 1) and applied("session", 1), 150, "all applied")
    assert [client.zcard(k) for k in seen.values()] == [N, N]
    # a watermark far ahead (on one partition: after every event) closes every window
    end = ce_record("m", "/agg", "end", {"k": "~", "amount": 0}, iso(T0 + 86_400_000))
    await produce_bulk(kafka_bootstrap, topic, {0: [end]})
    phase("all applied")
    answers = {"tumbling": tumbling_answer(rows), "session": session_answer(rows)}
    outs = await asyncio.gather(
        *(collect_data(kafka_bootstrap, sinks[kind], len(answers[kind]), 120) for kind in pipes)
    )
    phase("windows collected")
    for kind, out in zip(pipes, outs, strict=True):
        check(out, answers[kind])
    assert not (faults_dir / f"{pipes['tumbling'][0]}.aggregate-applied").exists()
    assert await asyncio.to_thread(replica_pid, pipes["session"][0]) != victim
    await wait_for(
        lambda: step_figure(client, pipes["tumbling"][0], "duplicate_events") > 0,
        30,
        "the replayed batch to be absorbed as duplicates",
    )
    # events later than allowed_lateness_s (their windows closed) go to the dead letters
    late = [
        ce_record("m", "/agg", f"late{i}", {"k": "k1", "amount": 1}, iso(T0 - 3_600_000))
        for i in range(3)
    ]
    await produce_bulk(kafka_bootstrap, topic, {0: late})
    for kind, (name, *_) in pipes.items():
        dead = await collect(kafka_bootstrap, dlqs[kind], 3, timeout_s=30)
        assert sorted(d.id for d in dead) == ["late0", "late1", "late2"]
        for d in dead:
            assert d["eberrortype"] == "AggregateLateEventError" and d["ebstep"] == STEP
            assert f"allowed_lateness_s ({LATENESS_S} s)" in d["eberror"]
        await wait_for(lambda n=name: step_figure(client, n, "late_events") >= 3, 30, "late count")
    phase("late events dead-lettered")
    client.close()


#: The redeploy test's stream: its first events (2 minutes of event time, ~2,000 windows),
#: produced as a live stream of CHUNKS chunks PACE_S apart, so the redeploy lands mid-stream.
REDEPLOY_N, CHUNKS, PACE_S = 40_000, 40, 0.25


async def test_a_redeploy_mid_stream_neither_loses_nor_double_counts(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, redis_url: str
) -> None:
    """A redeploy (a new version: Serve starts the new replica, the old one drains) while
    events flow: batches the old replica merged but had not committed are consumed again by
    the new one and absorbed by the dedupe; every window's count and sum are the answer's."""
    topic = topic_factory("aggr-in", partitions=PARTITIONS)
    sink, dlq = topic_factory("aggr-out", partitions=2), topic_factory("aggr-dlq")
    name = f"aggr-{uuid.uuid4().hex[:6]}"
    spec = doc(name, topic, sink, dlq, {"tumbling": {"size_s": SIZE_S}}, "replica")
    await asyncio.to_thread(deploy_pipeline, spec)
    rows = make_rows()[:REDEPLOY_N]
    parts = records(rows)
    first_pid = await asyncio.to_thread(replica_pid, name)
    client = redis.Redis.from_url(redis_url)
    seen = keys.aggregate_keys(name, STEP)[5]

    def applied() -> int:
        return int(client.zcard(seen))

    redeployed = asyncio.Event()

    async def stream() -> None:
        size = REDEPLOY_N // PARTITIONS // CHUNKS
        for c in range(CHUNKS):
            if c == CHUNKS - CHUNKS // 4:
                # the last quarter only once the redeploy ended (however long it took on a
                # loaded machine): the new replica has events still to merge
                await redeployed.wait()
            chunk = {p: recs[c * size : (c + 1) * size] for p, recs in parts.items()}
            await produce_bulk(kafka_bootstrap, topic, chunk)
            await asyncio.sleep(PACE_S)  # a live stream's pace, not a wait for a condition

    async def redeploy() -> int:
        try:
            await wait_for(lambda: applied() >= REDEPLOY_N // 10, 120, "10% applied")
            changed = json.loads(json.dumps(spec))
            changed["spec"]["serving"]["batch"]["linger_ms"] = 6  # a new version
            await asyncio.to_thread(deploy_pipeline, changed)
            return applied()
        finally:
            redeployed.set()

    _, at_redeploy = await asyncio.gather(stream(), redeploy())
    # the redeploy ended while the stream still had events to merge
    assert at_redeploy < REDEPLOY_N, "the stream ended before the redeploy: nothing was tested"
    assert await asyncio.to_thread(replica_pid, name) != first_pid
    await wait_for(lambda: applied() >= REDEPLOY_N, 120, "all applied")
    assert applied() == REDEPLOY_N
    end = ce_record("m", "/agg", "end", {"k": "~", "amount": 0}, iso(T0 + 86_400_000))
    await produce_bulk(kafka_bootstrap, topic, {0: [end]})
    answer = tumbling_answer(rows)
    check(await collect_data(kafka_bootstrap, sink, len(answer), 120), answer)
    client.close()
