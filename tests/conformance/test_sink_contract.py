"""The sink contract's behaviour suite: every registered sink kind (and the in-memory
``ListSink``) is bound here to a way of reading back what it wrote, and held to the
contract: durable on return, every item once, in order, nothing on an empty send, unencodable
events refused as a whole with :class:`SinkEncodeError`. A sink kind without a binding fails
the suite."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from eventbus import CloudEvent
from eventbus.eventing import event_from_json
from eventbus.eventing.sinks import Sink, SinkEncodeError
from eventbus.registry import sinks
from eventbus.testing import ListSink

ReadBack = Callable[[int], Awaitable[list[CloudEvent]]]
Binding = Callable[[pytest.FixtureRequest, Path], tuple[Sink, ReadBack]]


def _memory(request: pytest.FixtureRequest, tmp: Path) -> tuple[Sink, ReadBack]:
    sink = ListSink()

    async def read(n: int) -> list[CloudEvent]:
        return list(sink.events)

    return sink, read


def _kafka(request: pytest.FixtureRequest, tmp: Path) -> tuple[Sink, ReadBack]:
    from tests.integration.kafka_helpers import collect

    bootstrap = request.getfixturevalue("kafka_bootstrap")
    topic = request.getfixturevalue("topic_factory")("sink")
    sink = sinks.get("kafka").factory(
        sinks.get("kafka").config(topic=topic), default_bootstrap=bootstrap
    )

    async def read(n: int) -> list[CloudEvent]:
        return await collect(bootstrap, topic, n, timeout_s=30) if n else []

    return sink, read


def _jsonl(request: pytest.FixtureRequest, tmp: Path) -> tuple[Sink, ReadBack]:
    path = tmp / "out.jsonl"
    kind = sinks.get("jsonl")
    sink = kind.factory(kind.config(path=str(path)), default_bootstrap="unused:0")

    async def read(n: int) -> list[CloudEvent]:
        if not path.exists():
            return []
        return [event_from_json(line) for line in path.read_bytes().splitlines()]

    return sink, read


def _http(request: pytest.FixtureRequest, tmp: Path) -> tuple[Sink, ReadBack]:
    receiver = request.getfixturevalue("receiver_factory")()
    kind = sinks.get("http")
    # One request at a time: keyless events of one send may otherwise arrive in any order.
    config = kind.config(url=receiver.url, max_concurrency=1)
    sink = kind.factory(config, default_bootstrap="unused:0")

    async def read(n: int) -> list[CloudEvent]:
        return list(receiver.accepted)

    return sink, read


def _pipeline(request: pytest.FixtureRequest, tmp: Path) -> tuple[Sink, ReadBack]:
    import uuid

    from eventbus._internal.services import create_topics
    from tests.integration.kafka_helpers import collect

    bootstrap = request.getfixturevalue("kafka_bootstrap")
    target = f"target-{uuid.uuid4().hex[:8]}"  # the pipeline whose ingress topic it writes
    asyncio.run(create_topics(bootstrap, [f"eventbus-ingress-{target}"], 1))
    kind = sinks.get("pipeline")
    sink = kind.factory(kind.config.model_validate(target), default_bootstrap=bootstrap)

    async def read(n: int) -> list[CloudEvent]:
        topic = f"eventbus-ingress-{target}"
        return await collect(bootstrap, topic, n, timeout_s=30) if n else []

    return sink, read


BINDINGS: dict[str, tuple[Binding, list[Any]]] = {
    "memory": (_memory, []),
    "kafka": (_kafka, [pytest.mark.integration, pytest.mark.kafka]),
    "jsonl": (_jsonl, []),
    "http": (_http, []),
    "pipeline": (_pipeline, [pytest.mark.integration, pytest.mark.kafka]),
}


def test_every_sink_kind_has_a_binding() -> None:
    missing = [name for name in sinks.names() if name not in BINDINGS]
    assert not missing, f"sink kinds without a behaviour-suite binding: {missing}"


@pytest.fixture(params=[pytest.param(n, marks=m) for n, (_, m) in BINDINGS.items()])
def bound(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Sink, ReadBack]:
    binding, _ = BINDINGS[request.param]
    return binding(request, tmp_path)


@pytest.fixture(
    params=[pytest.param(n, marks=m) for n, (_, m) in BINDINGS.items() if n != "memory"]
)
def encoding(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Sink, ReadBack]:
    """The bindings of sinks that encode (ListSink keeps the objects themselves)."""
    binding, _ = BINDINGS[request.param]
    return binding(request, tmp_path)


def _events(n: int, start: int = 0) -> list[CloudEvent]:
    return [
        CloudEvent.create(type="suite", source="/sink", id=f"e{i}", data={"i": i, "s": "x" * 10})
        for i in range(start, start + n)
    ]


def _run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_sent_items_are_there_once_in_order(bound: tuple[Sink, ReadBack]) -> None:
    sink, read = bound

    async def main() -> list[CloudEvent]:
        await sink.start()
        try:
            await sink.send([(e, None) for e in _events(3)])
            await sink.send([(e, b"k") for e in _events(500, start=3)])
            return await read(503)
        finally:
            await sink.stop()

    got = _run(main())
    assert [e.attributes["id"] for e in got] == [f"e{i}" for i in range(503)]
    assert got[7].data == {"i": 7, "s": "x" * 10}


def test_an_empty_send_writes_nothing(bound: tuple[Sink, ReadBack]) -> None:
    sink, read = bound

    async def main() -> list[CloudEvent]:
        await sink.start()
        try:
            await sink.send([])
            return await read(0)
        finally:
            await sink.stop()

    assert _run(main()) == []


def test_unencodable_events_are_refused_and_nothing_is_sent(
    encoding: tuple[Sink, ReadBack],
) -> None:
    sink, read = encoding
    bad = CloudEvent.create(type="suite", source="/sink", id="bad", data={"x": object()})

    async def main() -> list[CloudEvent]:
        await sink.start()
        try:
            with pytest.raises(SinkEncodeError) as info:
                await sink.send([(_events(1)[0], None), (bad, None)])
            assert 1 in info.value.failures
            await sink.send([(e, None) for e in _events(1, start=1)])
            return await read(1)
        finally:
            await sink.stop()

    assert [e.attributes["id"] for e in _run(main())] == ["e1"]


def test_list_sink_failures_are_for_retry_tests() -> None:
    sink = ListSink(fail_times=1)
    with pytest.raises(ConnectionError):
        _run(sink.send([(e, None) for e in _events(1)]))
    _run(sink.send([(e, None) for e in _events(1)]))
    assert [e.attributes["id"] for e in sink.events] == ["e0"]
    assert json.loads(json.dumps(sink.calls)) == 2
