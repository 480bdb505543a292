"""Routes on the real stack (Ray Serve replica, Tansu brokers, Redis, a uvicorn subscriber).

The big one (issue 21): 20,000 events through a pipeline whose routes send orders to a real
HTTP subscriber (answering 503 to 10% of requests, timing out on 1%, 400 to a marked subset)
and every event to Kafka on another cluster (a second Tansu broker), with ``ordered: true``;
the replica is killed with SIGKILL mid-run. Every event reaches each of its sinks: the Kafka
topic exactly once, the subscriber once by ``ce-id`` (repeats only of requests in flight at the
kill, which no sender can know were taken), the 400s are in the dead-letter topic with their
status and sink, per-key order holds at both sinks, and the offsets are committed.

Then chained pipelines (``pipeline: NAME`` sinks) with a reply on the way: refused at deploy
while the target is missing; once it is deployed (with a ``pipeline: {}`` source), each event
goes to a subscriber with ``reply: true`` and its reply on into the target pipeline. (A target
that does not consume its ingress topic is refused too: tests/unit/serving.)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from eventbus import CloudEvent
from eventbus._internal.services import create_topics, start_tansu
from eventbus.errors import DeployError
from eventbus.eventing._codecs import encode_kafka_binary
from tests.fixtures.http_receiver import Received, Reply
from tests.integration.kafka_helpers import collect, produce, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

N = 20_000
KEYS = 200
ORDERS = {f"o{i}" for i in range(N) if i % 8 == 0}  # to the subscriber (and Kafka)
BAD = {f"o{i}" for i in range(N) if i % 400 == 8}  # orders the subscriber refuses (400)


def answer(ce_id: str, attempt: int) -> str:
    """What the subscriber does with a try: 1% time out, 10% 503, the rest 200 (by a hash of
    the id and the try, so a retry is a new draw)."""
    h = zlib.crc32(f"{ce_id}/{attempt}".encode()) % 1000
    return "hang" if h < 10 else "503" if h < 110 else "200"


async def produce_paced(bootstrap: str, topic: str, seconds: float, progress: list[int]) -> None:
    """N events, every 8th ``type: order`` and the others ``type: note``, with keys k0..k199
    and a per-key sequence, spread over ``seconds``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)
    await producer.start()
    try:
        seq: Counter[str] = Counter()
        start = time.monotonic()
        for base in range(0, N, 500):
            futures = []
            for i in range(base, min(N, base + 500)):
                key = f"k{i % KEYS}"
                seq[key] += 1
                e = CloudEvent.create(
                    type="order" if f"o{i}" in ORDERS else "note",
                    source="/it/routes",
                    id=f"o{i}",
                    data={"key": key, "seq": seq[key]},
                    partitionkey=key,
                    **({"bad": True} if f"o{i}" in BAD else {}),
                )
                headers, value = encode_kafka_binary(e)
                futures.append(await producer.send(topic, value, key=key.encode(), headers=headers))
            await asyncio.gather(*futures)
            progress[0] = min(N, base + 500)
            due = start + seconds * progress[0] / N
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())  # pacing the producer
    finally:
        await producer.stop()


def replica_pid(name: str) -> int:
    from ray import serve

    handle = serve.get_app_handle(f"eventbus-{name}")
    return int(handle.stats.remote().result(timeout_s=60)["pid"])


def in_key_order(events: list[tuple[str, int]]) -> dict[str, list[int]]:
    """Per key, the sequence numbers in order of first arrival, of ``(key, seq)`` pairs."""
    seen: set[tuple[str, int]] = set()
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, seq in events:
        if (key, seq) not in seen:
            seen.add((key, seq))
            by_key[key].append(seq)
    return by_key


@pytest.fixture
def other_cluster(tmp_path: Path) -> Any:
    """A second Kafka cluster (its own Tansu broker) for the route to Kafka elsewhere."""
    svc = start_tansu(log_dir=tmp_path)
    try:
        yield svc.address
    finally:
        svc.stop()


async def test_routes_fan_out_to_http_and_kafka_elsewhere_through_a_kill_9(
    other_cluster: str,  # first: stopped after the pipeline is deleted
    receiver_factory: Any,
    deploy_pipeline: Any,
    kafka_bootstrap: str,
    topic_factory: Any,
) -> None:
    started = time.monotonic()
    lock = threading.Lock()
    tries: Counter[str] = Counter()
    accepted: list[tuple[str, float, str, int]] = []  # (ce-id, when, key, seq) of each 2xx

    def behaviour(req: Received, n: int) -> Reply:
        ce_id = req.headers.get("ce-id", "")
        with lock:
            tries[ce_id] += 1
            attempt = tries[ce_id]
        if req.headers.get("ce-bad") == "true":
            return Reply(400, body=b'{"error": "order refused"}')
        what = answer(ce_id, attempt)
        if what == "hang":
            return Reply(hang=True)  # never answers: the sink's timeout_s passes
        if what == "503":
            return Reply(503, headers=[("retry-after", "0")])
        event = req.events[0]
        with lock:
            accepted.append((ce_id, time.monotonic(), event.data["key"], event.data["seq"]))
        return Reply(200)

    receiver = receiver_factory(behaviour)
    src, dlq = topic_factory("rt-in", partitions=4), topic_factory("rt-dlq")
    archive = f"rt-archive-{uuid.uuid4().hex[:6]}"
    await create_topics(other_cluster, [archive], 4)
    name = f"routes-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [{"id": "tag", "convert": {"set": {"data.routed": "true"}}}],
                "sinks": {
                    "hook": {
                        "http": {"url": receiver.url, "max_concurrency": 64, "timeout_s": 1.0}
                    },
                    "archive": {"kafka": {"topic": archive, "bootstrap_servers": other_cluster}},
                },
                "routes": [
                    {"when": "type == 'order'", "sinks": ["hook", "archive"], "ordered": True},
                    {"default": True, "sinks": ["archive"]},
                ],
                "dead_letter": {"kafka": {"topic": dlq}},
                "delivery": {
                    "dedupe": {"window_s": 600},
                    "backoff": {"initial_ms": 20, "max_ms": 200},
                },
                "serving": {"replicas": 1, "batch": {"max_size": 5000, "linger_ms": 5}},
            },
        }
    )
    deployed = time.monotonic()
    victim = await asyncio.to_thread(replica_pid, name)
    progress = [0]
    producer = asyncio.create_task(produce_paced(kafka_bootstrap, src, 4.0, progress))
    while progress[0] < N * 0.4:
        await asyncio.sleep(0.02)
    kill_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    await producer

    produced = time.monotonic()
    archived = await collect(other_cluster, archive, N, timeout_s=120)
    archived_at = time.monotonic()
    dead = await collect(kafka_bootstrap, dlq, len(BAD), timeout_s=60)
    await wait_committed(kafka_bootstrap, f"eventbus-{name}", src, timeout_s=60)
    took = time.monotonic() - started

    # Kafka on the other cluster: every event exactly once (dedupe searched it after the kill),
    # in per-key order.
    counts = Counter(e.id for e in archived)
    assert set(counts) == {f"o{i}" for i in range(N)}
    assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1][:5]
    assert all(e.data["routed"] is True for e in archived)
    for key, seqs in in_key_order([(e.data["key"], e.data["seq"]) for e in archived]).items():
        assert seqs == sorted(seqs), f"archive: order broken for {key}"

    # The subscriber: every order but the refused ones, counted by ce-id. Repeats are the
    # at-least-once of HTTP: requests taken just before the kill (their acknowledgements died
    # with the replica), or answered after the sink's timeout_s on this loaded machine.
    with lock:
        got = list(accepted)
    by_id: dict[str, list[float]] = defaultdict(list)
    for ce_id, at, _, _ in got:
        by_id[ce_id].append(at)
    assert set(by_id) == ORDERS - BAD
    repeats = {k: v for k, v in by_id.items() if len(v) > 1}
    by_kill = sum(1 for v in repeats.values() if v[0] < kill_at)
    assert len(repeats) <= len(ORDERS) // 10, len(repeats)
    for key, seqs in in_key_order([(k, s) for _, _, k, s in got]).items():
        assert seqs == sorted(seqs), f"subscriber: order broken for {key}"
    assert sum(1 for v in tries.values() if v > 1) > len(ORDERS) * 0.05  # 503s/timeouts retried

    # The refused orders: dead-lettered with the status, the body and the sink.
    assert {e.id for e in dead} == BAD
    for e in dead:
        assert (e["ebstep"], e["ebsink"], str(e["ebhttpstatus"])) == ("sink", "hook", "400")
        assert e["ebhttpbody"] == '{"error": "order refused"}'
    assert await asyncio.to_thread(replica_pid, name) != victim
    print(
        f"\nroutes: {N} events, {len(ORDERS)} orders to the subscriber ({len(repeats)} repeated, "
        f"{by_kill} of them taken before the kill), {N} to the other cluster; {took:.1f} s "
        f"from deploy to all committed (deploy {deployed - started:.1f} s, produce "
        f"{produced - deployed:.1f} s, archive complete after {archived_at - produced:.1f} s more)"
    )


def chain_doc(name: str, sources: list[Any], **outputs: Any) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": sources,
            "steps": [{"id": "hop", "convert": {"set": {f"data.{name.split('-')[0]}": "true"}}}],
            **outputs,
            "serving": {"replicas": 1, "batch": {"max_size": 500, "linger_ms": 5}},
        },
    }


async def test_pipelines_chain_through_pipeline_sinks_and_replies_go_on(
    deploy_pipeline: Any, kafka_bootstrap: str, topic_factory: Any, receiver_factory: Any
) -> None:
    """first -> a subscriber with reply: true -> its replies -> pipeline: second -> Kafka."""

    def enrich(req: Received, n: int) -> Reply:  # answers every event with a reply event
        head = [
            ("ce-specversion", "1.0"),
            ("ce-id", f"r-{req.headers['ce-id']}"),
            ("ce-source", "/subscriber"),
            ("ce-type", "c.enriched"),
            ("content-type", "application/json"),
        ]
        data = req.events[0].data
        return Reply(200, headers=head, body=json.dumps({**data, "enriched": True}).encode())

    receiver = receiver_factory(enrich)
    src, out = topic_factory("ch-in"), topic_factory("ch-out")
    tag = uuid.uuid4().hex[:6]
    first, second = f"first-{tag}", f"second-{tag}"
    upstream = chain_doc(
        first,
        [{"kafka": {"topic": src}}],
        sinks={
            "enrich": {"http": {"url": receiver.url, "reply": True}},
            "next": {"pipeline": second},
        },
        routes=[{"default": True, "sinks": ["enrich", "next"]}],
    )

    with pytest.raises(DeployError, match=f"names pipeline '{second}', which is not deployed"):
        deploy_pipeline(upstream)
    deploy_pipeline(chain_doc(second, [{"pipeline": {}}], sink={"kafka": {"topic": out}}))
    deploy_pipeline(upstream)
    events = [
        CloudEvent.create(type="c", source="/it/chain", id=f"c{i}", data={"i": i})
        for i in range(300)
    ]
    await produce(kafka_bootstrap, src, events)
    got = await collect(kafka_bootstrap, out, len(events), timeout_s=60)
    assert sorted(receiver.ids()) == sorted(e.id for e in events)
    # only the replies went on (the route's next sink gets them instead of the events)
    assert sorted(e.id for e in got) == sorted(f"r-{e.id}" for e in events)
    for e in got:
        assert e.type == "c.enriched" and e.source == "/subscriber"
        assert e.data["first"] is True and e.data["enriched"] is True and e.data["second"] is True
