"""Kafka over TLS and SASL, on real servers on loopback (nothing mocked).

Tansu 0.6.0 cannot terminate TLS itself: its ``--cert`` and ``--key`` options are declared as
conflicting (``--cert`` with ``--key`` is refused at startup, and either alone leaves the
listener plaintext). So TLS is terminated by Debian's ``stunnel4`` in front of the broker,
which advertises the TLS port: every client connection, bootstrap and per-broker, is TLS.
Tansu's ``--authentication`` speaks SASL SCRAM-SHA-256/512, but users can only be created over
an unauthenticated connection (``tansu user create``), so with memory storage a broker that
requires authentication has no users: the tests check that a refused login fails at start
with a clear error. A successful SCRAM login cannot be shown on this build of Tansu: with S3
storage (tried with a local S3 server, two brokers on one bucket, one without
``--authentication`` to create the user) ``tansu user create`` answers success but writes
nothing to the bucket, and the storage engines that keep users (``postgres://``, ``sqlite://``)
are not compiled in (``FeatureNotEnabled``).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from eventbus._internal.services import create_topics
from eventbus.errors import ConfigError, StackError
from eventbus.eventing import CloudEvent
from eventbus.eventing._kafka_client import kafka_client_kwargs
from eventbus.eventing._publish import publish_events, tail_events
from eventbus.eventing.sinks import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources import FetchSettings, KafkaSource, KafkaSourceConfig, SourceSinks
from tests.fixtures.kafka_tls import TlsBroker

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

N_EVENTS = 10_000


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    broker = TlsBroker(tmp_path_factory.mktemp("tls"))
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    broker = TlsBroker(tmp_path_factory.mktemp("sasl"), authentication=True)
    try:
        yield broker
    finally:
        broker.stop()


async def _wait_for(cond, timeout_s: float, what) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what()}")
        await asyncio.sleep(0.05)


async def test_source_and_sink_over_tls(tls_broker: TlsBroker) -> None:
    client = tls_broker.client()
    bootstrap = tls_broker.address
    await create_topics(bootstrap, ["in", "out"], partitions=2, client=client)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, **kafka_client_kwargs(client)
    )
    await producer.start()
    try:
        batch = [producer.send("in", orjson.dumps({"n": i})) for i in range(N_EVENTS)]
        await asyncio.gather(*(await asyncio.gather(*batch)))
    finally:
        await producer.stop()

    async def dispatch(events: list[CloudEvent]) -> list[list[CloudEvent]]:
        return [[e.replace(type="tls.out")] for e in events]

    # the stack's settings, given once; the sink inherits them
    source = KafkaSource(
        KafkaSourceConfig(topic="in"),
        pipeline="tls",
        bootstrap_servers=bootstrap,
        client=client,
        dispatch=dispatch,
        sinks=SourceSinks(
            sink=KafkaSink(KafkaSinkConfig(topic="out"), bootstrap_servers=bootstrap, client=client)
        ),
        fetch=FetchSettings(max_batch=2000, session_timeout_ms=2000),
    )
    await source.start()
    runner = asyncio.create_task(source.run())
    try:
        await _wait_for(lambda: source.stats()["committed"] >= N_EVENTS, 60, source.stats)
    finally:
        await source.stop()
        await runner
    assert source.stats()["outputs"] == N_EVENTS

    seen: list[str] = []
    await tail_events(
        bootstrap,
        "out",
        seen.append,
        from_beginning=True,
        max_events=N_EVENTS,
        idle_timeout_s=20,
        client=client,
    )
    assert len(seen) == N_EVENTS
    assert {orjson.loads(s)["data"]["n"] for s in seen} == set(range(N_EVENTS))
    assert all(orjson.loads(s)["type"] == "tls.out" for s in seen)


async def test_per_component_client_overrides_the_stack(tls_broker: TlsBroker) -> None:
    # the sink names its own settings in YAML; the runtime default (plaintext) is not used
    sink_config = KafkaSinkConfig.model_validate(
        {
            "topic": "override",
            "client": {"security_protocol": "SSL", "ca_file": str(tls_broker.ca_file)},
        }
    )
    sink = KafkaSink(sink_config, bootstrap_servers=tls_broker.address)
    await sink.start()
    try:
        await sink.send([(CloudEvent.create(type="t", source="s", id="1", data={"a": 1}), None)])
    finally:
        await sink.stop()


async def test_untrusted_ca_fails_at_start_with_a_clear_error(tls_broker: TlsBroker) -> None:
    client = tls_broker.client(ca_file=str(tls_broker.other_ca_file))
    sink = KafkaSink(
        KafkaSinkConfig(topic="x"), bootstrap_servers=tls_broker.address, client=client
    )
    with pytest.raises(StackError, match=r"certificate is not trusted .*set ca_file to the CA"):
        await sink.start()
    with pytest.raises(
        StackError, match=r"creating topics t1 cannot connect.*certificate is not trusted"
    ):
        await create_topics(tls_broker.address, ["t1"], client=client)


async def test_missing_secret_reference_is_named(tls_broker: TlsBroker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("EB_TEST_KAFKA_PASSWORD", raising=False)
    client = tls_broker.client(
        security_protocol="SASL_SSL",
        sasl={"mechanism": "PLAIN", "username": "u", "password": {"env": "EB_TEST_KAFKA_PASSWORD"}},
    )
    with pytest.raises(ConfigError, match="environment variable EB_TEST_KAFKA_PASSWORD is not set"):
        await publish_events(tls_broker.address, "x", [], client=client)


async def test_refused_sasl_login_fails_at_start(sasl_broker: TlsBroker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EB_TEST_KAFKA_PASSWORD", "not-the-password")
    client = sasl_broker.client(
        security_protocol="SASL_SSL",
        sasl={
            "mechanism": "SCRAM-SHA-256",
            "username": "nobody",
            "password": {"env": "EB_TEST_KAFKA_PASSWORD"},
        },
    )

    async def dispatch(events: list[CloudEvent]) -> list[list[CloudEvent]]:
        return [[e] for e in events]

    source = KafkaSource(
        KafkaSourceConfig(topic="in"),
        pipeline="sasl",
        bootstrap_servers=sasl_broker.address,
        client=client,
        dispatch=dispatch,
        sinks=SourceSinks(
            sink=KafkaSink(
                KafkaSinkConfig(topic="out"), bootstrap_servers=sasl_broker.address, client=client
            )
        ),
        fetch=FetchSettings(session_timeout_ms=2000),
    )
    with pytest.raises(StackError) as info:
        await source.start()
    message = str(info.value)
    assert "refused the SASL SCRAM-SHA-256 login of user 'nobody'" in message
    assert "env EB_TEST_KAFKA_PASSWORD" in message
    assert "not-the-password" not in message


def test_stunnel_binary_present() -> None:
    # CI installs it through `make system-deps`; a missing binary fails here, never skips
    assert subprocess.run(
        ["stunnel4", "-version"], capture_output=True, check=False
    ).returncode in (0, 1)
