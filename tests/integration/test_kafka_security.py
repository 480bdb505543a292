"""SASL/SCRAM-SHA-512 and ACLs served by Apache Kafka itself, over TLS (a ``trustme`` CA).

One single-node broker for the module (``kafka_sasl`` in ``tests/fixtures/kafka_tls.py``):
the admin (super) user's credential is bootstrapped when its storage is formatted; every other
user is created at runtime by the admin through the Admin API (AlterUserScramCredentials) and
granted ACLs (CreateAcls), as on a production cluster. Passwords reach EventBus only by
reference (``{file: PATH}``).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from eventbus.errors import DeployError, StackError
from eventbus.eventing import CloudEvent, KafkaClientConfig
from eventbus.eventing._kafka_client import kafka_client_kwargs
from eventbus.eventing._publish import tail_events
from eventbus.eventing.sinks import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources import FetchSettings, KafkaSource, KafkaSourceConfig, SourceSinks
from tests.fixtures.kafka_tls import SecureKafka

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.kafka_only]

N_EVENTS = 2_000


async def _wait_for(cond: Callable[[], bool], timeout_s: float, what: Callable[[], object]) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s: {what()}")
        await asyncio.sleep(0.05)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def _produce(kafka: SecureKafka, topic: str, n: int) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.address, linger_ms=5, **kafka_client_kwargs(kafka.client())
    )
    await producer.start()
    try:
        sent = [producer.send(topic, orjson.dumps({"n": i})) for i in range(n)]
        await asyncio.gather(*(await asyncio.gather(*sent)))
    finally:
        await producer.stop()


def _source(
    kafka: SecureKafka, pipeline: str, topic: str, out: str, client: KafkaClientConfig
) -> KafkaSource:
    async def dispatch(events: list[CloudEvent]) -> list[list[CloudEvent]]:
        return [[e.replace(type="scram.out")] for e in events]

    return KafkaSource(
        KafkaSourceConfig(topic=topic),
        pipeline=pipeline,
        bootstrap_servers=kafka.address,
        client=client,
        dispatch=dispatch,
        sinks=SourceSinks(
            sink=KafkaSink(
                KafkaSinkConfig(topic=out), bootstrap_servers=kafka.address, client=client
            )
        ),
        fetch=FetchSettings(max_batch=1000, session_timeout_ms=6000),
    )


async def test_scram_user_created_through_the_admin_api_moves_events(
    kafka_sasl: SecureKafka,
) -> None:
    user, password = _name("alice"), uuid.uuid4().hex
    pipeline, src, out = _name("scram"), _name("in"), _name("out")
    kafka_sasl.create_topics([src, out], partitions=2)
    kafka_sasl.add_user(user, password)
    kafka_sasl.grant(user, "READ", topic=src)
    kafka_sasl.grant(user, "READ", group=f"eventbus-{pipeline}")
    kafka_sasl.grant(user, "WRITE", topic=out)
    await _produce(kafka_sasl, src, N_EVENTS)

    client = kafka_sasl.user_client(user, kafka_sasl.password_file(user, password))
    source = _source(kafka_sasl, pipeline, src, out, client)
    await source.start()  # the login and the ACL check (READ src, WRITE out) pass
    runner = asyncio.create_task(source.run())
    try:
        await _wait_for(lambda: source.stats()["committed"] >= N_EVENTS, 90, source.stats)
    finally:
        await source.stop()
        await runner
    assert source.stats()["outputs"] == N_EVENTS

    seen: list[str] = []  # read back as the admin: the user may only write `out`
    await tail_events(
        kafka_sasl.address,
        out,
        seen.append,
        from_beginning=True,
        max_events=N_EVENTS,
        idle_timeout_s=20,
        client=kafka_sasl.client(),
    )
    assert {orjson.loads(s)["data"]["n"] for s in seen} == set(range(N_EVENTS))
    assert all(orjson.loads(s)["type"] == "scram.out" for s in seen)


async def test_wrong_password_is_named_without_the_password(kafka_sasl: SecureKafka) -> None:
    user, wrong = _name("bob"), "not-the-password-" + uuid.uuid4().hex
    kafka_sasl.add_user(user, uuid.uuid4().hex)
    ref = kafka_sasl.password_file(user, wrong)
    client = kafka_sasl.user_client(user, ref)
    sink = KafkaSink(
        KafkaSinkConfig(topic="any"), bootstrap_servers=kafka_sasl.address, client=client
    )
    source = _source(kafka_sasl, _name("wrong"), "any", "any", client)
    for start in (sink.start, source.start):
        with pytest.raises(StackError) as info:
            await asyncio.wait_for(start(), 60)
        message = str(info.value)
        assert f"at {kafka_sasl.address} (SASL_SSL)" in message
        assert f"the broker refused the SASL SCRAM-SHA-512 login of user {user!r}" in message
        assert "invalid credentials" in message  # the broker's own verdict
        assert f"the password in file {ref['file']}" in message
        assert wrong not in message


async def test_missing_read_acl_is_named_at_source_start(kafka_sasl: SecureKafka) -> None:
    user, password = _name("dave"), uuid.uuid4().hex
    src, out = _name("in"), _name("out")
    kafka_sasl.create_topics([src, out])
    kafka_sasl.add_user(user, password)
    kafka_sasl.grant(user, "WRITE", topic=out)  # may write the sink, not read the source
    client = kafka_sasl.user_client(user, kafka_sasl.password_file(user, password))
    source = _source(kafka_sasl, _name("noread"), src, out, client)
    expect = (
        f"principal User:{user} is not authorized to READ topic {src!r} (it may not even "
        f"DESCRIBE {src!r}); grant it with: kafka-acls.sh --bootstrap-server "
        f"{kafka_sasl.address} --command-config admin.properties --add --allow-principal "
        f"User:{user} --operation READ --topic {src}"
    )
    with pytest.raises(StackError, match=re.escape(expect)):
        await asyncio.wait_for(source.start(), 60)


async def test_acl_denial_is_named_at_deploy(
    kafka_sasl: SecureKafka, deploy_pipeline: Callable[[dict[str, Any]], Any]
) -> None:
    user, password = _name("carol"), uuid.uuid4().hex
    name, src, out = _name("acl"), _name("in"), _name("out")
    kafka_sasl.create_topics([src, out])
    kafka_sasl.add_user(user, password)
    kafka_sasl.grant(user, "READ", topic=src)
    kafka_sasl.grant(user, "READ", group=f"eventbus-{name}")
    kafka_sasl.grant(user, "DESCRIBE", topic=out)  # sees the sink topic, may not write it
    client = kafka_sasl.user_client(user, kafka_sasl.password_file(user, password))

    def settings() -> dict[str, Any]:  # one copy per use: the YAML dump makes no aliases
        return {
            "bootstrap_servers": kafka_sasl.address,
            "client": client.model_dump(mode="json", exclude_defaults=True),
        }

    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": src, **settings()}}],
            "steps": [{"id": "tag", "convert": {"set": {"data.tagged": "true"}}}],
            "sink": {"kafka": {"topic": out, **settings()}},
            "serving": {"replicas": 1},
        },
    }
    expect = (
        f"principal User:{user} is not authorized to WRITE topic {out!r}; grant it with: "
        f"kafka-acls.sh --bootstrap-server {kafka_sasl.address} --command-config "
        f"admin.properties --add --allow-principal User:{user} --operation WRITE --topic {out}"
    )
    with pytest.raises(DeployError) as info:
        deploy_pipeline(doc)
    message = str(info.value)
    assert f"pipeline {name!r} could not be deployed" in message
    assert expect in message
    assert password not in message
