"""The source contract's behaviour suite.

Every registered source kind: its config validates under its YAML key, its factory says what
the replicas consume for it (a Kafka topic: its own, or the ingress topic the gateway writes),
its description and schema entry exist. The runtime contract (start, run, stop, stats;
acknowledge only after the sinks took the batch) is run on :class:`MemorySource`; the Kafka
source's runtime is held to it by tests/integration/test_kafka_source.py.
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
    with pytest.raises(ValueError, match=r"exactly one transport key \(kafka, http or grpc\)"):
        SourceConfig.model_validate({"kafka": {"topic": "a"}, "http": {}})


def _events(n: int) -> list[CloudEvent]:
    return [CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"i": i}) for i in range(n)]


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
