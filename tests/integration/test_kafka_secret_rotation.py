"""A Kafka SASL password stored on the stack (``{secret: NAME}``) rotated while the source and
sink run: the broker's credential changes first, the refused logins are counted and named,
then the stored secret changes and events flow again, nothing restarted.

On Apache Kafka with SCRAM-SHA-512 whose logins expire (``kafka_sasl_reauth``:
``connections.max.reauth.ms``), so the clients log in again within seconds; the secret in the
session's Redis, encrypted, resolved as a replica resolves it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from cryptography.fernet import Fernet

from eventbus._internal.redis_client import connect
from eventbus._internal.secret_store import KEY_ENV, SecretStore, configure, load_key
from eventbus.eventing import CloudEvent
from eventbus.eventing._kafka_client import kafka_client_kwargs
from eventbus.eventing._publish import tail_events
from eventbus.eventing.sinks import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources import FetchSettings, KafkaSource, KafkaSourceConfig, SourceSinks
from tests.fixtures.kafka_tls import SecureKafka

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.kafka_only, pytest.mark.redis]

N = 200  # events per phase: enough to cross batches, no more


async def _wait_for(cond: Callable[[], bool], timeout_s: float, what: Callable[[], object]) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s: {what()}")
        await asyncio.sleep(0.05)


async def _produce(kafka: SecureKafka, topic: str, numbers: range) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.address, linger_ms=5, **kafka_client_kwargs(kafka.client())
    )
    await producer.start()
    try:
        sent = [producer.send(topic, orjson.dumps({"n": i})) for i in numbers]
        await asyncio.gather(*(await asyncio.gather(*sent)))
    finally:
        await producer.stop()


def _logins(caplog: pytest.LogCaptureFixture, user: str) -> int:
    """aiokafka's logins of ``user`` the broker accepted (its INFO line) since the last clear."""
    return sum(r.getMessage().startswith(f"Authenticated as {user} ") for r in caplog.records)


async def test_rotated_stored_secret_is_picked_up_without_a_restart(
    kafka_sasl_reauth: SecureKafka,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kafka = kafka_sasl_reauth
    tag = uuid.uuid4().hex[:8]
    user, secret, src, out = f"rot-{tag}", f"KAFKA_PW_{tag}", f"in-{tag}", f"out-{tag}"
    old, new = "old-" + uuid.uuid4().hex, "new-" + uuid.uuid4().hex
    kafka.create_topics([src, out], partitions=2)
    kafka.add_user(user, old)
    monkeypatch.setenv(KEY_ENV, Fernet.generate_key().decode())
    store = SecretStore(connect(redis_url), load_key())
    store.set(secret, old.encode())
    configure(redis_url, ttl_s=0.0)  # as a replica: `{secret: NAME}` resolves from the stack

    client = kafka.user_client(user, {"secret": secret})

    async def dispatch(events: list[CloudEvent]) -> list[list[CloudEvent]]:
        return [[e.replace(type="rotated.out")] for e in events]

    source = KafkaSource(
        KafkaSourceConfig(topic=src),
        pipeline=f"rot-{tag}",
        bootstrap_servers=kafka.address,
        client=client,
        dispatch=dispatch,
        sinks=SourceSinks(
            sink=KafkaSink(
                KafkaSinkConfig(topic=out), bootstrap_servers=kafka.address, client=client
            )
        ),
        fetch=FetchSettings(max_batch=100, session_timeout_ms=6000),
    )
    stats: Callable[[], dict[str, Any]] = source.stats
    await source.start()
    runner = asyncio.create_task(source.run())
    try:
        await _produce(kafka, src, range(N))
        await _wait_for(lambda: stats()["committed"] >= N, 60, stats)
        assert stats()["sasl_logins_refused"] == 0

        # the broker's credential rotated first: every new login with the stored (old) one is
        # refused, counted, and logged naming the user, the secret and the fix
        with caplog.at_level(logging.ERROR, logger="eventbus.eventing.kafka"):
            kafka.add_user(user, new)
            await _produce(kafka, src, range(N, 2 * N))
            await _wait_for(lambda: stats()["sasl_logins_refused"] >= 1, 60, stats)
        errors = [r.getMessage() for r in caplog.records if r.name == "eventbus.eventing.kafka"]
        assert any(
            f"the broker refused the SASL SCRAM-SHA-512 login of user {user!r}" in m
            and f"the password from secret {secret} is not the broker's" in m
            and f"`eventbus secret set {secret}`" in m
            and "no restart needed" in m
            for m in errors
        ), errors
        assert not any(old in m or new in m for m in errors)  # never a value

        # the stored secret rotated: picked up within a second, the clients' next logins (the
        # broker ends each after REAUTH_MS) use it, and events flow, nothing restarted
        with caplog.at_level(logging.INFO, logger="aiokafka.conn"):
            caplog.clear()
            store.set(secret, new.encode())
            await _wait_for(lambda: stats()["sasl_password_changes"] >= 1, 30, stats)
            await _wait_for(lambda: _logins(caplog, user) >= 2, 60, stats)
            await _produce(kafka, src, range(2 * N, 3 * N))
            await _wait_for(lambda: stats()["committed"] >= 3 * N, 90, stats)
    finally:
        await source.stop()
        await runner
        configure(None)
        store.delete(secret)
    seen: list[str] = []
    await tail_events(
        kafka.address,
        out,
        seen.append,
        from_beginning=True,
        max_events=3 * N,
        idle_timeout_s=20,
        client=kafka.client(),
    )
    assert {orjson.loads(s)["data"]["n"] for s in seen} == set(range(3 * N))  # at least once
