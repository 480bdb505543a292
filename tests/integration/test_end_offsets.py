"""The ringer's look at partition ends (``serving/_end_offsets.py``) on real brokers: the
session's (Apache Kafka, or Tansu), and Apache Kafka serving TLS and SCRAM-SHA-512 itself. It
sees records arrive over the connections it keeps, does not create a topic that is not there
(the stack's Kafka creates topics on first use), and speaks TLS and SASL with the stack's client
settings."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs
from eventbus.serving._end_offsets import EndOffsets, EndOffsetsError
from tests.fixtures.kafka_tls import SecureKafka

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.tansu,  # the embedded default's set: also run on Tansu (make test)
]


async def produce(bootstrap: str, topic: str, per_partition: dict[int, int], client=None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **kafka_client_kwargs(client))
    await producer.start()
    try:
        for partition, n in per_partition.items():
            for _ in range(n):
                await producer.send_and_wait(topic, b"x", partition=partition)
    finally:
        await producer.stop()


async def topics_of(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def first_ends(look: EndOffsets, tps: list[tuple[str, int]]) -> dict[str, int]:
    """The look's answer once every partition has a leader (a topic just created may have
    none yet: its leaders are asked again a second later)."""
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        ends = await asyncio.to_thread(look.ends, tps)
        if len(ends) == len(tps) or asyncio.get_running_loop().time() > deadline:
            return ends
        await asyncio.sleep(0.1)


async def look_sees_records_arrive(
    bootstrap: str, topic: str, client: KafkaClientConfig | None
) -> None:
    look = EndOffsets(bootstrap, client)
    tps = [(topic, 0), (topic, 1)]
    try:
        before = await first_ends(look, tps)
        assert before == {f"{topic}[0]": 0, f"{topic}[1]": 0}
        await produce(bootstrap, topic, {1: 3}, client)
        after = await asyncio.to_thread(look.ends, tps)
        assert after[f"{topic}[0]"] == 0
        # Tansu answers the last batch's base offset + 1: past 0 once a batch arrived
        assert after[f"{topic}[1]"] >= 1
        # the other partitions of one look: only those asked, the same connection
        assert await asyncio.to_thread(look.ends, [(topic, 1)]) == {
            f"{topic}[1]": after[f"{topic}[1]"]
        }
    finally:
        await asyncio.to_thread(look.close)


async def test_the_look_sees_records_arrive(kafka_bootstrap: str, topic_factory) -> None:
    topic = topic_factory("ends", partitions=2)
    await look_sees_records_arrive(kafka_bootstrap, topic, None)


async def test_a_missing_topic_is_not_looked_at_nor_created(
    kafka_bootstrap: str, topic_factory
) -> None:
    topic = topic_factory("ends")
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    look = EndOffsets(kafka_bootstrap)
    try:
        assert await first_ends(look, [(topic, 0)]) == {f"{topic}[0]": 0}
        for _ in range(3):  # the missing topic's leaders are asked again each second
            ends = await asyncio.to_thread(look.ends, [(topic, 0), (missing, 0)])
            assert ends == {f"{topic}[0]": 0}
            await asyncio.sleep(0.6)
    finally:
        await asyncio.to_thread(look.close)
    assert missing not in await topics_of(kafka_bootstrap), "the look created the topic"


@pytest.mark.kafka_only  # Apache Kafka serving TLS and SCRAM itself
async def test_the_look_speaks_tls(kafka_tls: SecureKafka) -> None:
    client = kafka_tls.client()
    kafka_tls.create_topics(["ends"], partitions=2)
    await look_sees_records_arrive(kafka_tls.address, "ends", client)


@pytest.mark.kafka_only
async def test_the_look_logs_in_with_scram_and_a_refused_login_is_an_error(
    kafka_sasl: SecureKafka,
) -> None:
    user, password, topic = f"ringer-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex, "ends"
    kafka_sasl.create_topics([topic], partitions=2)
    kafka_sasl.add_user(user, password)
    kafka_sasl.grant(user, "DESCRIBE", topic=topic)  # Metadata and ListOffsets need no more
    client = kafka_sasl.user_client(user, kafka_sasl.password_file(user, password))
    look = EndOffsets(kafka_sasl.address, client)
    try:
        tps = [(topic, 0), (topic, 1)]
        assert await first_ends(look, tps) == {f"{topic}[0]": 0, f"{topic}[1]": 0}
    finally:
        await asyncio.to_thread(look.close)
    wrong = kafka_sasl.user_client(user, kafka_sasl.password_file(user, "not-" + password))
    refused = EndOffsets(kafka_sasl.address, wrong, timeout_s=5.0)
    try:
        with pytest.raises(EndOffsetsError):
            await asyncio.to_thread(refused.ends, [(topic, 0)])
    finally:
        await asyncio.to_thread(refused.close)
