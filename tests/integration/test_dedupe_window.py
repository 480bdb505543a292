"""Dedupe across a crash, on the real broker and Redis, without Ray.

A process that claimed a batch's outputs and died before marking them done (after the sink's
acknowledgement, or before anything was sent) leaves them pending; the next process to see
them searches the sink from the claimed positions and sends exactly the missing ones.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest

from eventbus import CloudEvent
from eventbus.eventing._delivery import RedisDeduper, dedupe_key
from eventbus.eventing.sinks._kafka import KafkaSink, KafkaSinkConfig
from tests.integration.kafka_helpers import collect

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.redis]


def events(prefix: str, n: int) -> list[tuple[CloudEvent, bytes | None]]:
    return [
        (
            CloudEvent.create(type="t", source="/dw", id=f"{prefix}{i}", data={"i": i}),
            f"k{i % 7}".encode(),
        )
        for i in range(n)
    ]


class Process:
    """One owner of a pipeline's outputs: its own sink (producer) and deduper."""

    def __init__(self, bootstrap: str, redis_url: str, topic: str, pipeline: str) -> None:
        self.sink = KafkaSink(KafkaSinkConfig(topic=topic), bootstrap_servers=bootstrap)
        self.dedupe = RedisDeduper(redis_url, pipeline, 600)

    async def __aenter__(self) -> Process:
        await self.sink.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.sink.stop()
        await self.dedupe.close()

    async def deliver(
        self,
        items: list[tuple[CloudEvent, bytes | None]],
        *,
        die: str | None = None,
        send: slice | None = None,
    ) -> int:
        """The source's sequence: claim, send, mark done. ``die`` stops it after ``claim`` or
        ``send`` (as a kill -9 would: nothing after that point runs). Returns the outputs sent."""
        keys = self.dedupe.digests([dedupe_key(e) for e, _ in items])
        skip = await self.dedupe.claim(keys, self.sink)
        todo = [(x, k) for x, k, s in zip(items, keys, skip) if not s]
        if die == "claim":
            return 0
        sent = todo[send] if send is not None else todo
        await self.sink.send([x for x, _ in sent])
        if die == "send":
            return len(sent)
        await self.dedupe.mark([k for _, k in sent], hashed=True)
        return len(sent)


@pytest.fixture
def pipeline() -> str:
    return f"dw-{uuid.uuid4().hex[:8]}"


async def test_crash_after_the_sink_ack_sends_nothing_twice(
    kafka_bootstrap: str, redis_url: str, topic_factory, pipeline: str
) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("dw", partitions=3)
    batch = events("a", 600)
    async with Process(kafka_bootstrap, redis_url, topic, pipeline) as p:
        await p.deliver(events("warm", 50))  # earlier batches: the positions have moved on
        assert await p.deliver(batch, die="send") == 600
    # Other owners write meanwhile (the search must read past their records).
    async with Process(kafka_bootstrap, redis_url, topic, pipeline) as other:
        await other.deliver(events("b", 300))
    async with Process(kafka_bootstrap, redis_url, topic, pipeline) as p:
        assert await p.deliver(batch) == 0
        assert (p.dedupe.resolved, p.dedupe.found_in_sink) == (600, 600)
        # Found in the sink: marked done, so the next redelivery needs no search.
        assert await p.deliver(batch) == 0
        assert p.dedupe.resolved == 600
    out = await collect(kafka_bootstrap, topic, 950)
    counts = Counter(e.id for e in out)
    assert len(counts) == 950 and max(counts.values()) == 1


async def test_crash_before_the_send_loses_nothing(
    kafka_bootstrap: str, redis_url: str, topic_factory, pipeline: str
) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("dw", partitions=2)
    batch = events("c", 400)
    async with Process(kafka_bootstrap, redis_url, topic, pipeline) as p:
        assert await p.deliver(batch, die="claim") == 0
    async with Process(kafka_bootstrap, redis_url, topic, pipeline) as p:
        assert await p.deliver(batch) == 400
        assert (p.dedupe.resolved, p.dedupe.found_in_sink) == (400, 0)
    out = await collect(kafka_bootstrap, topic, 400)
    assert sorted(e.id for e in out) == sorted(e.id for e, _ in batch)


async def test_crash_mid_send_sends_only_what_is_missing(
    kafka_bootstrap: str, redis_url: str, topic_factory, pipeline: str
) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("dw", partitions=2)
    batch = events("d", 300)
    async with Process(kafka_bootstrap, redis_url, topic, pipeline) as p:
        assert await p.deliver(batch, die="send", send=slice(0, 120)) == 120
    async with Process(kafka_bootstrap, redis_url, topic, pipeline) as p:
        assert await p.deliver(batch) == 180
        assert p.dedupe.found_in_sink == 120
    out = await collect(kafka_bootstrap, topic, 300)
    counts = Counter(e.id for e in out)
    assert len(counts) == 300 and max(counts.values()) == 1


async def test_repeats_within_a_batch_and_delivered_ids_are_skipped(
    kafka_bootstrap: str, redis_url: str, topic_factory, pipeline: str
) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("dw")
    batch = events("e", 10)
    async with Process(kafka_bootstrap, redis_url, topic, pipeline) as p:
        assert await p.deliver(batch + batch[:3]) == 10
        assert await p.deliver(batch) == 0
        assert p.dedupe.resolved == 0  # no crash, no search
        keys = p.dedupe.digests([dedupe_key(e) for e, _ in batch] + [None])
        assert await p.dedupe.claim(keys, p.sink) == [True] * 10 + [False]


async def test_a_claim_waits_out_a_redis_restart_and_a_redis_gone_for_good_fails_open(
    kafka_bootstrap: str, topic_factory, pipeline: str, tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A batch consumed again while Redis restarts (append-only file) sends nothing twice: its
    claim waits for Redis instead of delivering without dedupe. A Redis that stays away is
    given up after CLAIM_WAIT_S (the outputs go without dedupe, not a stalled pipeline)."""
    import asyncio
    import time

    from eventbus._internal.redis_service import start_redis
    from eventbus.eventing import _delivery

    topic = topic_factory("dw", partitions=3)
    batch = events("r", 300)
    svc = start_redis(data_dir=tmp_path, appendonly=True)
    port = int(svc.address.rsplit(":", 1)[1].split("/")[0])
    try:
        async with Process(kafka_bootstrap, svc.address, topic, pipeline) as p:
            assert await p.deliver(batch) == 300
            svc.stop()
            again = asyncio.create_task(p.deliver(batch))  # the batch consumed again
            deadline = time.monotonic() + 10
            while p.dedupe.errors == 0:  # its claim found Redis away
                assert time.monotonic() < deadline, "the claim never tried Redis"
                await asyncio.sleep(0.02)
            assert not again.done()
            svc = await asyncio.to_thread(
                start_redis, port=port, data_dir=tmp_path, appendonly=True
            )
            assert await asyncio.wait_for(again, 30) == 0  # every output known delivered

            # the connection drops after the claim script ran (its answer lost): the keys hold
            # that try's claim, which the next try knows as its own (sent once, not skipped)
            import redis.exceptions

            real, calls = p.dedupe._claim, []

            async def answer_lost_once(**kw: Any) -> Any:
                found = await real(**kw)
                calls.append(kw["args"][1])
                if len(calls) == 1:
                    raise redis.exceptions.ConnectionError("Connection reset by peer")
                return found

            p.dedupe._claim = answer_lost_once  # type: ignore[method-assign]
            lost = events("l", 50)
            assert await p.deliver([*lost, lost[0]]) == 50  # a repeat within the batch: once
            assert len(calls) == 2 and calls[0] != calls[1]
            p.dedupe._claim = real  # type: ignore[method-assign]
            assert await p.deliver(lost) == 0

            svc.stop()
            monkeypatch.setattr(_delivery, "CLAIM_WAIT_S", 0.5)
            t0 = time.monotonic()
            assert await p.deliver(events("s", 10)) == 10  # fail open, after the wait
            assert 0.4 < time.monotonic() - t0 < 5
    finally:
        svc.stop()
    out = await collect(kafka_bootstrap, topic, 360, timeout_s=30)
    assert Counter(e.id for e in out) == Counter(
        [e.id for e, _ in batch] + [f"l{i}" for i in range(50)] + [f"s{i}" for i in range(10)]
    )
