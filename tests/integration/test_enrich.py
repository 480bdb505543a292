"""An ``enrich`` step on the real stack (Ray Serve replica, broker, Redis): events get their
customer from an HTTP endpoint, each customer fetched once (the replica's cache) and no
faster than the rate limit; a call past the timeout and, once the endpoint is down, every
call fails: those events are dead-lettered with the reason. A CloudEvents SQL filter, an
EventBridge pattern and a JSONata convert run before it, on the replica."""

from __future__ import annotations

import json
from typing import Any

import pytest

from eventbus import CloudEvent
from tests.fixtures.http_receiver import Received, Reply
from tests.integration.kafka_helpers import collect, produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

N = 200


SLOW = 999  # the customer whose endpoint answers after the step's timeout
RATE = 2.0  # calls per second the step may make


def _customer(req: Received, n: int) -> Reply:
    cid = req.path.rsplit("/", 1)[1]
    delay = 8.0 if cid == str(SLOW) else 0.0
    return Reply(200, body=json.dumps({"name": f"c{cid}"}).encode(), delay_s=delay)


async def test_events_enriched_end_to_end_and_an_outage_dead_lettered(
    deploy_pipeline: Any, kafka_bootstrap: str, topic_factory: Any, receiver_factory: Any
) -> None:
    receiver = receiver_factory(_customer)
    src, out, dlq = topic_factory("in"), topic_factory("out"), topic_factory("dlq")
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": "enriched"},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [
                    # the other new languages on the real stack too (their compiled forms
                    # travel to the replica): CloudEvents SQL, an EventBridge pattern, JSONata
                    {"id": "orders", "filter": {"sql": "type = 'o'"}},
                    {"id": "known", "filter": {"pattern": {"data": {"cid": [{"exists": True}]}}}},
                    {
                        "id": "tag",
                        "convert": {
                            "jsonata": "$merge([$, {'data': $merge([data, {'tagged': true}])}])"
                        },
                    },
                    {
                        "id": "customer",
                        "enrich": {
                            "http": {"url": f"http://127.0.0.1:{receiver.port}/c/{{data.cid}}"},
                            "into": "data.customer",
                            "cache": {"key": "data.cid", "ttl_s": 600},
                            "call_retries": 0,
                            "max_rate": RATE,
                            "burst": 1,
                            "backoff": {"initial_ms": 10, "max_ms": 20},
                            "timeout_s": 2,
                        },
                    },
                ],
                "sink": {"kafka": {"topic": out}},
                "dead_letter": {"kafka": {"topic": dlq}},
                "serving": {"replicas": 1, "batch": {"max_size": 100, "linger_ms": 5}},
            },
        }
    )

    def events(first: int, n: int, keys: int) -> list[CloudEvent]:
        return [
            CloudEvent.create(type="o", source="/t", id=f"o{i}", data={"cid": i % keys})
            for i in range(first, first + n)
        ]

    others = [  # dropped by the sql filter, and by the pattern (no cid)
        CloudEvent.create(type="x", source="/t", id="x1", data={"cid": 1}),
        CloudEvent.create(type="o", source="/t", id="x2", data={"other": 1}),
    ]
    await produce(kafka_bootstrap, src, [*others, *events(0, N, 10)])
    got = await collect(kafka_bootstrap, out, N, timeout_s=120)

    async def why() -> str:
        """What the endpoint saw and what was dead-lettered: a failure's diagnosis."""
        dead = await collect(kafka_bootstrap, dlq, 10_000, timeout_s=3)
        calls = [(r.path, round(r.at, 2)) for r in receiver.requests]
        return f"calls {calls}; dead letters {[(e.id, e['eberror']) for e in dead]}"

    if sorted(e.id for e in got) != sorted(f"o{i}" for i in range(N)):
        missing = sorted({f"o{i}" for i in range(N)} - {e.id for e in got})
        pytest.fail(f"{len(got)} of {N} arrived, missing {missing[:20]}: {await why()}")
    assert all(e.data["customer"] == {"name": f"c{e.data['cid']}"} for e in got)
    assert all(e.data["tagged"] is True and e["type"] == "o" for e in got)
    # one call per customer: the rest from the cache
    assert len(receiver.requests) == 10, await why()
    # the rate limit: 10 calls at RATE/s with a burst of 1 are sent over >= 9 / RATE s (4.5);
    # arrivals can only be later than sends, so only the first one's delay can shorten the
    # span seen here: 2 s are left for it
    arrivals = sorted(r.at for r in receiver.requests)
    assert arrivals[-1] - arrivals[0] >= 9 / RATE - 2.0, arrivals

    # a call past the timeout: the event is dead-lettered (on_failure: fail) with the reason
    slow = CloudEvent.create(type="o", source="/t", id="slow", data={"cid": SLOW})
    await produce(kafka_bootstrap, src, [slow])
    first = await collect(kafka_bootstrap, dlq, 1, timeout_s=120)
    assert len(first) == 1, await why()
    (timed_out,) = first
    assert timed_out.id == "slow" and timed_out["eberrortype"] == "EnrichTimeout", timed_out

    receiver.stop()  # the outage: customers not cached cannot be enriched
    await produce(kafka_bootstrap, src, events(N, 20, 1000))
    dead = [e for e in await collect(kafka_bootstrap, dlq, 21, timeout_s=120) if e.id != "slow"]
    assert sorted(e.id for e in dead) == sorted(f"o{i}" for i in range(N, N + 20)), [
        (e.id, e["eberror"]) for e in dead
    ]
    for e in dead:
        assert e["ebstep"] == "customer" and e["eberrortype"] == "EnrichConnectError"
        assert f"enrich endpoint http://127.0.0.1:{receiver.port}/c/" in e["eberror"]
