"""The Kafka source's group timings, ``session_timeout_ms`` and ``heartbeat_interval_ms``: Kafka's
own client defaults, the range Apache Kafka's brokers accept, heartbeats well within the
session, errors that name the value and the fix at the YAML's position, and the values
reaching the consumer (and the revocation's wait)."""

from __future__ import annotations

import re

import pytest
from tests.unit.pipelines.test_loader import GOOD, problems

from eventbus.eventing.sources import FetchSettings, KafkaSource, KafkaSourceConfig, SourceSinks
from eventbus.eventing.sources._kafka_fetch import KafkaFetcher
from eventbus.pipelines import load_pipeline_text
from eventbus.testing import ListSink


def with_kafka(fields: str) -> str:
    return GOOD.replace("kafka: {topic: orders}", f"kafka: {{topic: orders, {fields}}}")


def test_the_defaults_are_kafkas_own_client_defaults() -> None:
    config = KafkaSourceConfig(topic="t")
    assert (config.session_timeout_ms, config.heartbeat_interval_ms) == (10_000, 3_000)
    loaded = load_pipeline_text(
        with_kafka("session_timeout_ms: 45000, heartbeat_interval_ms: 15000"), "p.yaml"
    )
    source = loaded.spec.sources[0].kafka
    assert source is not None
    assert (source.session_timeout_ms, source.heartbeat_interval_ms) == (45_000, 15_000)


@pytest.mark.parametrize(
    ("fields", "expect"),
    [
        (
            "session_timeout_ms: 2000",
            "p.yaml:6:50: spec.sources[0].kafka.session_timeout_ms: session_timeout_ms is 2000; "
            "Apache Kafka brokers refuse a consumer-group session outside 6000..1800000 ms "
            "(group.min.session.timeout.ms / group.max.session.timeout.ms); set it within that "
            "range (the default, 10000, is Kafka's own)",
        ),
        ("session_timeout_ms: 1800001", "session_timeout_ms is 1800001; Apache Kafka brokers"),
        (
            "heartbeat_interval_ms: 50",
            "heartbeat_interval_ms is 50; heartbeats more often than every 100 ms only load "
            "the group coordinator: set it to at least 100 (the default, 3000, is Kafka's own)",
        ),
        (
            "session_timeout_ms: 6000, heartbeat_interval_ms: 4000",
            "heartbeat_interval_ms (4000) is more than half of session_timeout_ms (6000): one "
            "late heartbeat would expire the member's session; set heartbeat_interval_ms to at "
            "most 3000 (Kafka advises a third, 2000) or raise session_timeout_ms",
        ),
        (
            "heartbeat_interval_ms: 10000",  # the default session: 10000
            "heartbeat_interval_ms (10000) is more than half of session_timeout_ms (10000)",
        ),
        ("session_timeout_ms: soon", "session_timeout_ms: input should be a valid integer"),
    ],
)
def test_timings_outside_what_kafka_takes_are_rejected_with_the_fix(
    fields: str, expect: str
) -> None:
    found = problems(with_kafka(fields))
    assert len(found) == 1, found
    assert found[0].startswith("p.yaml:")
    assert expect in found[0]


def test_the_edges_of_the_range_load() -> None:
    for fields in (
        "session_timeout_ms: 6000",  # heartbeat 3000: half of it, the most taken
        "session_timeout_ms: 1800000, heartbeat_interval_ms: 100",
    ):
        load_pipeline_text(with_kafka(fields), "p.yaml")


async def dispatch(events: list[object]) -> list[object]:
    return [[e] for e in events]


def source(config: KafkaSourceConfig, fetch: FetchSettings | None = None) -> KafkaSource:
    return KafkaSource(
        config,
        pipeline="p",
        bootstrap_servers="127.0.0.1:1",
        dispatch=dispatch,  # type: ignore[arg-type]
        sinks=SourceSinks(ListSink()),
        fetch=fetch,
    )


def test_the_consumer_takes_the_configs_timings_unless_the_fetch_settings_give_them() -> None:
    config = KafkaSourceConfig(topic="t", session_timeout_ms=30_000, heartbeat_interval_ms=5_000)
    yaml_only = source(config)
    kwargs = yaml_only._fetcher._consumer_kwargs()
    assert (kwargs["session_timeout_ms"], kwargs["heartbeat_interval_ms"]) == (30_000, 5_000)
    assert yaml_only._revoke_timeout_s == 30.0  # a revocation waits up to the session
    given = source(config, FetchSettings(session_timeout_ms=6_000, heartbeat_interval_ms=2_000))
    kwargs = given._fetcher._consumer_kwargs()
    assert (kwargs["session_timeout_ms"], kwargs["heartbeat_interval_ms"]) == (6_000, 2_000)
    # a session given in the settings alone heartbeats every third of it (at most the config's)
    kwargs = source(config, FetchSettings(session_timeout_ms=6_000))._fetcher._consumer_kwargs()
    assert (kwargs["session_timeout_ms"], kwargs["heartbeat_interval_ms"]) == (6_000, 2_000)
    kwargs = source(config, FetchSettings(session_timeout_ms=60_000))._fetcher._consumer_kwargs()
    assert kwargs["heartbeat_interval_ms"] == 5_000
    # a fetcher made without the source (the config's timings, the settings' None)
    fetcher = KafkaFetcher(config, FetchSettings(), pipeline="p", group="g", bootstrap_servers="x")
    assert fetcher._consumer_kwargs()["session_timeout_ms"] == 30_000


def test_fetch_settings_whose_heartbeat_outlasts_the_session_are_refused() -> None:
    expect = (
        "kafka source of pipeline 'p': heartbeat_interval_ms=6000, session_timeout_ms=6000; "
        "heartbeats must come more often than the session expires (Kafka advises a third of it)"
    )
    with pytest.raises(ValueError, match=re.escape(expect)):
        source(
            KafkaSourceConfig(topic="t"),
            FetchSettings(session_timeout_ms=6_000, heartbeat_interval_ms=6_000),
        )
