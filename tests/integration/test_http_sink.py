"""A pipeline delivering to an HTTP subscriber on the real stack (Ray Serve replica, broker,
Redis): the subscriber answers 503 to a share of first tries and 400 to a marked subset;
every other event reaches it exactly once (counted by ce-id), the 400s land in the
dead-letter topic with their status and body, and the source's offsets are committed."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from eventbus import CloudEvent
from tests.fixtures.http_receiver import Received, Reply
from tests.integration.kafka_helpers import collect, produce, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

N = 2000


async def test_http_subscriber_gets_each_event_once_and_400s_are_dead_lettered(
    deploy_pipeline: Any, kafka_bootstrap: str, topic_factory: Any, receiver_factory: Any
) -> None:
    lock = threading.Lock()
    tries: Counter[str] = Counter()

    def behaviour(req: Received, n: int) -> Reply:
        ce_id = req.headers.get("ce-id", "")
        with lock:
            tries[ce_id] += 1
            first = tries[ce_id] == 1
        if req.headers.get("ce-bad") == "true":
            return Reply(400, body=b'{"error": "bad"}')
        if first and int(ce_id[1:]) % 7 == 0:
            return Reply(503, headers=[("retry-after", "0")])
        return Reply(200)

    receiver = receiver_factory(behaviour)
    src, dlq = topic_factory("in", partitions=2), topic_factory("dlq")
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": "hooked"},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [{"id": "mark", "convert": {"set": {"type": "'n.hooked'"}}}],
                "sink": {"http": {"url": receiver.url, "max_concurrency": 32}},
                "dead_letter": {"kafka": {"topic": dlq}},
                "serving": {"replicas": 1, "batch": {"max_size": 500, "linger_ms": 5}},
            },
        }
    )
    events = [
        CloudEvent.create(
            type="n.created",
            source="/t",
            id=f"n{i}",
            data={"n": i},
            **({"bad": True} if i % 50 == 3 else {}),
        )
        for i in range(N)
    ]
    await produce(kafka_bootstrap, src, events)
    bad = {f"n{i}" for i in range(N) if i % 50 == 3}
    dead = await collect(kafka_bootstrap, dlq, len(bad), timeout_s=40)
    await wait_committed(kafka_bootstrap, "eventbus-hooked", src)

    got = Counter(receiver.ids())
    assert set(got) == {f"n{i}" for i in range(N)} - bad
    assert max(got.values()) == 1, [k for k, v in got.items() if v > 1][:5]
    assert all(tries[f"n{i}"] == 2 for i in range(0, N, 7) if f"n{i}" not in bad)
    assert {e.id for e in dead} == bad and len(dead) == len(bad)
    for e in dead:
        # binary-mode Kafka headers carry attribute values as text
        assert e["ebstep"] == "sink" and str(e["ebhttpstatus"]) == "400"
        assert e["ebhttpbody"] == '{"error": "bad"}' and e["eberrortype"] == "HttpStatusError"
