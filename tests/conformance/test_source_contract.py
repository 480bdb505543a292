"""The source contract's behaviour suite.

Every registered source kind: its config validates under its YAML key, its factory says what
the replicas consume for it (a Kafka topic: its own, or the ingress topic the gateway writes),
its description and schema entry exist. The runtime contract (start, run, stop, stats;
acknowledge only after the sinks took the batch, nothing lost when a sink fails once) runs on
:class:`MemorySource` and on :class:`KafkaSource` against the real broker, the runtime of every
built-in kind (``http`` and ``grpc`` events reach the replicas through the ingress topic, read
by a KafkaSource too).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from eventbus import CloudEvent, Failure
from eventbus.eventing import KafkaSourceConfig
from eventbus.eventing.sources import ingress_topic
from eventbus.pipelines import SourceConfig
from eventbus.pipelines._schema import pipeline_schema
from eventbus.registry import sources
from eventbus.testing import ListSink, MemorySource

EXAMPLES: dict[str, dict[str, Any]] = {
    "kafka": {"topic": "orders"},
    "http": {"path": "/orders"},
    "grpc": {},
    "pipeline": {},
    "schedule": {"every_s": 60, "data": {"report": "daily"}},
}


def test_every_source_kind_has_an_example() -> None:
    missing = [n for n in sources.names() if n not in EXAMPLES]
    assert not missing, f"source kinds without a behaviour-suite example: {missing}"


@pytest.mark.parametrize("name", sources.names())
def test_kind_validates_and_says_what_it_consumes(name: str) -> None:
    kind = sources.get(name)
    assert kind.description
    assert name in pipeline_schema()["$defs"]["SourceConfig"]["properties"]
    config = SourceConfig.model_validate({name: EXAMPLES[name]})
    assert config.kind == name
    consumed = kind.factory(config.options, "shop")
    assert isinstance(consumed, KafkaSourceConfig)
    if kind.trait("ingress"):
        assert consumed.topic == ingress_topic("shop")
    describe = kind.trait("describe")
    assert describe is None or isinstance(describe(EXAMPLES[name]), str)


def test_two_kinds_in_one_source_are_refused_naming_the_kinds() -> None:
    with pytest.raises(
        ValueError, match=r"exactly one transport key \(kafka, http, grpc, schedule or pipeline\)"
    ):
        SourceConfig.model_validate({"kafka": {"topic": "a"}, "http": {}})


def _events(n: int) -> list[CloudEvent]:
    return [CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"i": i}) for i in range(n)]


async def _outcomes(batch: list[CloudEvent]) -> list[Any]:
    """Drop even i, fail i % 5 == 4, pass the rest."""
    return [
        Failure("s", "ValueError", "odd")
        if e.data["i"] % 5 == 4
        else [e]
        if e.data["i"] % 2
        else []
        for e in batch
    ]


def _expected(n: int) -> tuple[set[str], set[str]]:
    out = {f"e{i}" for i in range(n) if i % 5 != 4 and i % 2}
    dead = {f"e{i}" for i in range(n) if i % 5 == 4}
    return out, dead


async def _run_memory(
    events: list[CloudEvent], sink: ListSink, dead: ListSink, request: Any
) -> dict[str, int]:
    source = MemorySource(events, _outcomes, sink, dead_letter=dead, max_batch=7)
    await source.start()
    for _ in range(3):  # a sink failure ends run(); the runtime runs it again (at-least-once)
        try:
            await source.run()
            break
        except ConnectionError:
            continue
    await source.stop()
    return source.stats()


async def _run_kafka(
    events: list[CloudEvent], sink: ListSink, dead: ListSink, request: Any
) -> dict[str, int]:
    import time

    from eventbus.eventing.sources import DeliveryPolicy, FetchSettings, KafkaSource, SourceSinks
    from tests.integration.kafka_helpers import produce

    bootstrap = request.getfixturevalue("kafka_bootstrap")
    topic = request.getfixturevalue("topic_factory")("src-contract", partitions=2)
    await produce(bootstrap, topic, events)
    source = KafkaSource(
        KafkaSourceConfig(topic=topic),
        pipeline="contract",
        bootstrap_servers=bootstrap,
        dispatch=_outcomes,
        sinks=SourceSinks(sink=sink, dead_letter=dead),
        fetch=FetchSettings(max_batch=7, session_timeout_ms=6000),
        delivery=DeliveryPolicy(retry_initial_s=0.05),
    )
    await source.start()
    task = asyncio.create_task(source.run())
    deadline = time.monotonic() + 60
    while source.stats()["committed"] < len(events) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await source.stop()
    await task
    return source.stats()


RUNTIMES = {
    "memory": pytest.param(_run_memory, id="memory"),
    "kafka": pytest.param(
        _run_kafka, id="kafka", marks=[pytest.mark.integration, pytest.mark.kafka]
    ),
}


@pytest.mark.parametrize("runtime", list(RUNTIMES.values()))
def test_every_event_is_delivered_dead_lettered_or_dropped_once_though_the_sink_failed(
    runtime: Any, request: pytest.FixtureRequest
) -> None:
    n = 60
    sink, dead = ListSink(fail_times=1), ListSink()
    stats = asyncio.run(runtime(_events(n), sink, dead, request))
    want_out, want_dead = _expected(n)
    assert sorted(e.attributes["id"] for e in sink.events) == sorted(want_out)  # each once
    assert sorted(e.attributes["id"] for e in dead.events) == sorted(want_dead)
    assert all(e.attributes["ebstep"] == "s" for e in dead.events)
    assert stats["consumed"] >= n and stats.get("committed", stats.get("acked")) == n
    assert sink.calls >= 2  # the failed send was made again


def test_memory_source_delivers_then_acknowledges() -> None:
    async def dispatch(batch: list[CloudEvent]) -> list[Any]:
        return [
            Failure("s", "ValueError", "odd")
            if e.data["i"] % 5 == 4
            else [e]
            if e.data["i"] % 2
            else []
            for e in batch
        ]

    sink, dead = ListSink(), ListSink()
    source = MemorySource(_events(23), dispatch, sink, dead_letter=dead, max_batch=10)

    async def main() -> None:
        await source.start()
        await source.run()
        await source.stop()

    asyncio.run(main())
    stats = source.stats()
    assert stats["acked"] == stats["consumed"] == 23 and stats["batches"] == 3
    assert {e.attributes["ebstep"] for e in dead.events} == {"s"}
    assert len(sink.events) + len(dead.events) + stats["dropped"] == 23
    assert sink.started and sink.stopped


def test_memory_source_does_not_acknowledge_what_the_sink_refused() -> None:
    async def dispatch(batch: list[CloudEvent]) -> list[Any]:
        return [[e] for e in batch]

    sink = ListSink(fail_times=1)
    source = MemorySource(_events(5), dispatch, sink)
    with pytest.raises(ConnectionError):
        asyncio.run(source.run())
    assert source.acked == 0 and sink.events == []
    asyncio.run(source.run())  # at-least-once: the batch comes again
    assert source.acked == 5 and len(sink.events) == 5
