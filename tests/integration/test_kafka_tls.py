"""Kafka over TLS served by Apache Kafka itself (``ssl.keystore.type=PEM``), a ``trustme`` CA.

One single-node broker for the module (``kafka_tls`` in ``tests/fixtures/kafka_tls.py``);
every client connection, bootstrap and per-broker, is TLS: the broker advertises only its
TLS listener.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from eventbus._internal.services import create_topics
from eventbus.errors import ConfigError, StackError
from eventbus.eventing import CloudEvent
from eventbus.eventing._kafka_client import kafka_client_kwargs
from eventbus.eventing._publish import publish_events, tail_events
from eventbus.eventing.sinks import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources import FetchSettings, KafkaSource, KafkaSourceConfig, SourceSinks
from tests.fixtures.kafka_tls import SecureKafka

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.kafka_only]

N_EVENTS = 5_000


async def _wait_for(cond: Callable[[], bool], timeout_s: float, what: Callable[[], object]) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s: {what()}")
        await asyncio.sleep(0.05)


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_producer_and_consumer_over_tls(kafka_tls: SecureKafka) -> None:
    kwargs = kafka_client_kwargs(kafka_tls.client())
    topic = _topic("tls-pc")
    await create_topics(kafka_tls.address, [topic], partitions=2, client=kafka_tls.client())
    producer = AIOKafkaProducer(bootstrap_servers=kafka_tls.address, **kwargs)
    await producer.start()
    try:
        for i in range(100):
            await producer.send(topic, orjson.dumps({"n": i}))
        await producer.flush()
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_tls.address,
        group_id=None,
        auto_offset_reset="earliest",
        **kwargs,
    )
    await consumer.start()
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 30
        while len(seen) < 100:
            assert time.monotonic() < deadline, f"only {len(seen)} of 100 records came back"
            for records in (await consumer.getmany(timeout_ms=500)).values():
                seen.update(orjson.loads(r.value)["n"] for r in records)
    finally:
        await consumer.stop()
    assert seen == set(range(100))


async def test_source_and_sink_over_tls(kafka_tls: SecureKafka) -> None:
    client = kafka_tls.client()
    bootstrap = kafka_tls.address
    src, out = _topic("tls-in"), _topic("tls-out")
    await create_topics(bootstrap, [src, out], partitions=2, client=client)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, **kafka_client_kwargs(client)
    )
    await producer.start()
    try:
        batch = [producer.send(src, orjson.dumps({"n": i})) for i in range(N_EVENTS)]
        await asyncio.gather(*(await asyncio.gather(*batch)))
    finally:
        await producer.stop()

    async def dispatch(events: list[CloudEvent]) -> list[list[CloudEvent]]:
        return [[e.replace(type="tls.out")] for e in events]

    # the stack's settings, given once; the sink inherits them
    source = KafkaSource(
        KafkaSourceConfig(topic=src),
        pipeline="tls",
        bootstrap_servers=bootstrap,
        client=client,
        dispatch=dispatch,
        sinks=SourceSinks(
            sink=KafkaSink(KafkaSinkConfig(topic=out), bootstrap_servers=bootstrap, client=client)
        ),
        fetch=FetchSettings(max_batch=2000, session_timeout_ms=6000),
    )
    await source.start()
    runner = asyncio.create_task(source.run())
    try:
        await _wait_for(lambda: source.stats()["committed"] >= N_EVENTS, 90, source.stats)
    finally:
        await source.stop()
        await runner
    assert source.stats()["outputs"] == N_EVENTS

    seen: list[str] = []
    await tail_events(
        bootstrap,
        out,
        seen.append,
        from_beginning=True,
        max_events=N_EVENTS,
        idle_timeout_s=20,
        client=client,
    )
    assert len(seen) == N_EVENTS
    assert {orjson.loads(s)["data"]["n"] for s in seen} == set(range(N_EVENTS))
    assert all(orjson.loads(s)["type"] == "tls.out" for s in seen)


async def test_per_component_client_overrides_the_stack(kafka_tls: SecureKafka) -> None:
    # the sink names its own settings in YAML; the runtime default (plaintext) is not used
    sink_config = KafkaSinkConfig.model_validate(
        {
            "topic": _topic("override"),
            "client": {"security_protocol": "SSL", "ca_file": str(kafka_tls.ca_file)},
        }
    )
    sink = KafkaSink(sink_config, bootstrap_servers=kafka_tls.address)
    await sink.start()
    try:
        await sink.send([(CloudEvent.create(type="t", source="s", id="1", data={"a": 1}), None)])
    finally:
        await sink.stop()


async def test_untrusted_ca_fails_at_start_with_a_clear_error(kafka_tls: SecureKafka) -> None:
    client = kafka_tls.client(ca_file=str(kafka_tls.other_ca_file))
    sink = KafkaSink(KafkaSinkConfig(topic="x"), bootstrap_servers=kafka_tls.address, client=client)
    with pytest.raises(StackError, match=r"certificate is not trusted .*set ca_file to the CA"):
        await sink.start()
    with pytest.raises(
        StackError, match=r"creating topics t1 cannot connect.*certificate is not trusted"
    ):
        await create_topics(kafka_tls.address, ["t1"], client=client)


async def test_plaintext_client_on_the_tls_listener_is_named(kafka_tls: SecureKafka) -> None:
    sink = KafkaSink(KafkaSinkConfig(topic="x"), bootstrap_servers=kafka_tls.address)
    with pytest.raises(StackError, match=rf"at {kafka_tls.address} \(PLAINTEXT\)"):
        await asyncio.wait_for(sink.start(), 60)


async def test_missing_secret_reference_is_named(
    kafka_tls: SecureKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EB_TEST_KAFKA_PASSWORD", raising=False)
    client = kafka_tls.client(
        security_protocol="SASL_SSL",
        sasl={"mechanism": "PLAIN", "username": "u", "password": {"env": "EB_TEST_KAFKA_PASSWORD"}},
    )
    with pytest.raises(ConfigError, match="environment variable EB_TEST_KAFKA_PASSWORD is not set"):
        await publish_events(kafka_tls.address, "x", [], client=client)
