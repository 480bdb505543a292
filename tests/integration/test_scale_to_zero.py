"""Scale to zero on the real stack: a ``replicas.min: 0`` pipeline goes to zero replicas after
``idle_s`` without events (its Serve application deleted, the pipeline kept in Redis), shows as
SCALED_TO_ZERO (not failed), and the events published while
it is at zero wake it (the controller's watcher sees the lag; after a controller restart too,
from the state in Redis) and all arrive exactly once. The watcher lives in the controller, which
is killed with SIGKILL while the pipeline is at zero: the restarted controller reads the state
from Redis and wakes the pipeline."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from typing import Any

import pytest

from tests.integration.kafka_helpers import collect
from tests.integration.test_autoscaling import produce, replica_count, wait_for
from tests.integration.test_control_plane import controller_pid

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.tansu,  # the embedded default's set: also run on Tansu (make test)
]

N = 5000  # the figure: events published while the pipeline is at zero
# The watcher's own poll, far slower than the ringer's look (ZERO_LOOK_S): a wake that the
# poll won is a race the ringer lost by seconds, not by a loaded machine's tenths.
POLL_S = 5.0


async def waking(redis_url: str, name: str, stop: asyncio.Event) -> dict[str, Any]:
    """The pipeline's wake-up record (``waking_at``, ``woken_by``), looked at every 20 ms
    until ``stop`` (it is there from the watcher's decision until the replica runs)."""
    import json

    from eventbus._internal import keys
    from eventbus._internal.redis_client import connect_async

    redis = connect_async(redis_url, decode_responses=True)
    try:
        while not stop.is_set():
            raw = await redis.hget(keys.SCALED_TO_ZERO, name)
            if raw is not None and "waking_at" in json.loads(raw):
                return dict(json.loads(raw))
            await asyncio.sleep(0.02)
    finally:
        await redis.aclose()
    return {}


async def bridge_holders(redis_url: str, group: str, stop: asyncio.Event) -> set[str]:
    """The values the join bridge of ``group`` takes until ``stop`` (looked at every 20 ms)."""
    from eventbus._internal import keys
    from eventbus._internal.redis_client import connect_async

    redis = connect_async(redis_url, decode_responses=True)
    seen: set[str] = set()
    try:
        while not stop.is_set():
            value = await redis.get(keys.join_bridge(group))
            if value is not None:
                seen.add(value)
            await asyncio.sleep(0.02)
    finally:
        await redis.aclose()
    return seen


async def test_idle_pipeline_scales_to_zero_and_events_at_zero_arrive_once(
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    eventbus_client: Any,
    redis_url: str,
    broker_kind: str,
) -> None:
    src, sink = topic_factory("z-in", partitions=2), topic_factory("z-out")
    name = f"zero-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [{"id": "keep", "filter": "type == 'a.test'"}],
                "sink": {"kafka": {"topic": sink}},
                # poll_s 5: the watcher's own checks would mostly not see the wake within
                # seconds; the controller's ringer (one look every ZERO_LOOK_S) does
                "serving": {"replicas": {"min": 0, "max": 2, "idle_s": 2, "poll_s": POLL_S}},
            },
        }
    )
    assert replica_count(name) == 1, "a min: 0 pipeline starts with one replica"

    def app_gone() -> bool:  # at zero Serve holds no application of the pipeline
        from ray import serve

        return f"eventbus-{name}" not in serve.status().applications

    def at_zero() -> bool:
        return eventbus_client.status(name)["state"] == "SCALED_TO_ZERO" and app_gone()

    down_s = await wait_for(at_zero, 30, "the scale to zero after idle_s")
    row = next(r for r in eventbus_client.list() if r["name"] == name)
    assert row["status"] == "SCALED_TO_ZERO"
    figures = eventbus_client.status(name)["figures"]
    assert figures["state"] == "SCALED_TO_ZERO" and figures["last_event_at"] is not None
    assert figures["replicas"] == 0
    assert replica_count(name) == 0

    # the watcher's state is in Redis: a restarted controller goes on watching
    victim = await asyncio.to_thread(controller_pid)
    os.kill(victim, signal.SIGKILL)
    await wait_for(lambda: controller_pid() != victim, 60, "the controller to restart")

    assert at_zero(), "the controller's restart woke the pipeline without events"
    assert app_gone(), "the controller's restore ran the application of a pipeline at zero"
    # the restarted watcher reads the committed offsets once the drain settled (SETTLE_S after
    # the scale-down, at its next poll) and the ringer takes them at its next idle look
    from eventbus.serving._doorbell import IDLE_LOOK_S
    from eventbus.serving._scale_to_zero import SETTLE_S

    since = eventbus_client.status(name)["figures"]["scaled_to_zero_since"]
    armed_at = since + SETTLE_S + POLL_S + IDLE_LOOK_S + 0.5
    await wait_for(lambda: time.time() > armed_at, 30, "the restarted watcher's first reads")
    stop = asyncio.Event()
    holders = asyncio.create_task(bridge_holders(redis_url, f"eventbus-{name}", stop))
    woken = asyncio.create_task(waking(redis_url, name, stop))
    produced_at = time.time()
    await produce(kafka_bootstrap, src, N)  # while no replica runs
    out = await collect(kafka_bootstrap, sink, N, timeout_s=60)
    stop.set()
    # the ringer saw the records and nudged the watcher: not its poll, a poll_s later
    wake = await woken
    detect_s = wake["waking_at"] - produced_at
    print(f"the wake-up began {detect_s:.2f} s after the events ({wake.get('woken_by')})")
    # the watcher's own poll may see the records first when it falls before the ringer's look
    # (ZERO_LOOK_S, slower on a loaded machine); then it was as fast: within half a poll (a
    # ringer that does not ring leaves the wake to the poll, on average POLL_S / 2 later)
    assert wake.get("woken_by") == "doorbell" or detect_s < POLL_S / 2, f"not the ringer's: {wake}"
    seen = await holders
    if broker_kind == "tansu":
        # the woken replica consumed by assignment while its group join ran (Tansu holds a
        # first join for half the session timeout: serving/_bridge.py)
        assert seen - {"open"}, f"the woken replica's source did not take the join bridge: {seen}"
    else:  # Apache Kafka answers a first join in tens of ms: no bridge
        assert not seen, f"a join bridge was opened on Apache Kafka: {seen}"
    assert len(out) == N, f"{len(out)} outputs for {N} events"
    assert {e.id for e in out} == {f"a{i}" for i in range(N)}
    # idle again: back to zero, and everything was committed (no lag woke it again)
    again_s = await wait_for(at_zero, 30, "the second scale to zero")
    assert eventbus_client.status(name)["figures"]["totals"]["consumed"] == N
    # exactly once: the sink holds each event once, also after the replica's drain and commit
    again = await collect(kafka_bootstrap, sink, N, timeout_s=30)
    assert sorted(e.id for e in again) == sorted(f"a{i}" for i in range(N))
    # replay and redrive call the replicas directly: they wake a pipeline at zero first
    assert eventbus_client.wake(name) is True
    assert eventbus_client.status(name)["state"] == "RUNNING" and not app_gone()
    # asked again at once: idle_s (2 s) counts from the wake, so later it may rightly be at
    # zero again
    assert eventbus_client.wake(name) is False, "a running pipeline was woken"
    await wait_for(lambda: replica_count(name) == 1, 60, "the replica after a wake")
    print(
        f"to zero after {down_s:.1f} s; woken {detect_s:.2f} s after the events; {N} events "
        f"delivered; to zero again after {again_s:.1f} s"
    )


@pytest.mark.tansu_only  # Apache Kafka wakes a waiting fetch itself: sources long-poll there
async def test_an_idle_replica_parks_and_the_doorbell_wakes_it_for_the_next_event(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, redis_url: str
) -> None:
    """A warm replica with nothing to do stops fetching (parks, recorded in Redis); the
    controller's ringer sees the next record's offset and rings it, and the event arrives (the
    ring, not the parked source's fallback fetch after PARK_MAX_S, woke it)."""
    import json

    from eventbus._internal import keys
    from eventbus._internal.redis_client import connect_async

    src, sink = topic_factory("bell-in"), topic_factory("bell-out")
    name = f"bell-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [{"id": "keep", "filter": "type == 'a.test'"}],
                "sink": {"kafka": {"topic": sink}},
                "serving": {"replicas": {"min": 1, "max": 1}},
            },
        }
    )
    redis = connect_async(redis_url, decode_responses=True)
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.psubscribe(keys.doorbell("*"))
    try:
        parked: list[str] = []

        async def parks() -> None:
            for _ in range(300):
                for pid, raw in (await redis.hgetall(keys.PARKED)).items():
                    if f"{src}[0]" in json.loads(raw)["ends"]:
                        parked.append(pid)
                        return
                await asyncio.sleep(0.1)
            raise AssertionError("the idle replica's source did not park within 30 s")

        await parks()
        await produce(kafka_bootstrap, src, 1)
        out = await collect(kafka_bootstrap, sink, 1, timeout_s=30)
        assert [e.id for e in out] == ["a0"]
        rung: list[str] = []
        for _ in range(50):  # the ring came before the output: it waits in the subscription
            msg = await pubsub.get_message(timeout=0.1)  # None for the psubscribe reply too
            if msg is not None:
                rung.append(msg["channel"])
            if keys.doorbell(parked[0]) in rung:
                break
        assert keys.doorbell(parked[0]) in rung, f"the parked source was not rung: {rung}"
    finally:
        await pubsub.aclose()
        await redis.aclose()


async def test_serves_control_loop_idles_only_while_it_holds_no_deployment(
    eventbus_client: Any,
) -> None:
    """The pace switch works on this Ray's Serve (a Ray upgrade that moves its internals makes
    it answer "unsupported", and this test fails): asked to idle, Serve's controller runs a
    round every 2 s while it holds no deployment, and its usual rounds (5 a second) when it
    holds one; asked back to its pace, the rounds resume at once."""
    import ray
    from ray import serve
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    from eventbus.serving._ray_adapter import set_serve_pace

    eventbus_client.list()  # the session's controller is up, and Serve with it
    serve.start(proxy_location="Disabled")
    handle = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)

    def rounds() -> int:
        return int(
            ray.get(
                handle.__ray_call__.remote(lambda c: c._health_metrics_tracker.num_control_loops)
            )
        )

    def deployments() -> int:  # counted in Serve's controller (its states do not pickle)
        return int(
            ray.get(
                handle.__ray_call__.remote(
                    lambda c: len(c.deployment_state_manager._deployment_states)
                )
            )
        )

    async def rate(seconds: float) -> float:
        before = rounds()
        await asyncio.sleep(seconds)
        return (rounds() - before) / seconds

    try:
        assert await asyncio.to_thread(set_serve_pace, True) == "idle"
        await asyncio.sleep(2.5)  # the round under way ends
        held, idle_rate = deployments(), await rate(6.0)
        if held:  # other tests' applications: Serve keeps its pace
            assert idle_rate >= 3, f"{held} deployments, yet {idle_rate:.1f} rounds/s"
        else:
            assert idle_rate <= 1, f"no deployment, yet {idle_rate:.1f} rounds/s"
    finally:
        assert await asyncio.to_thread(set_serve_pace, False) == "busy"
    assert await rate(2.0) >= 3, "Serve's pace came back"
