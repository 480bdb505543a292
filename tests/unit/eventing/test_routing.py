"""Routing outputs to named sinks: the plan (fan-out, default route, unrouted, failing
predicates), each (event, sink) pair delivered on its own (a blocked sink holds back only its
own deliveries, ordered sinks keep batch order), refusals dead-lettered per sink with
``ebsink``, and HTTP replies going on to the next sink (a real uvicorn subscriber)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from tests.fixtures.http_receiver import Received, Reply

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._routing import Route, Routing
from eventbus.eventing.sinks import HttpSink, HttpSinkConfig, SinkPartialError
from eventbus.eventing.sources import DeliveryPolicy, KafkaSourceConfig, SourceSinks
from eventbus.eventing.sources._kafka_batch import BatchMaker, KafkaBatch
from eventbus.eventing.sources._kafka_delivery import Delivery
from eventbus.testing import ListSink

pytestmark = pytest.mark.timeout(60)

TP = TopicPartition("in", 0)
STATS = ("decode_errors", "outputs", "dropped", "failed", "dead_lettered", "duplicates")


def ev(i: int, **attrs: Any) -> CloudEvent:
    return CloudEvent.create(
        type=attrs.pop("type", "t"), source="/s", id=f"e{i}", data={"i": i}, **attrs
    )


def plan_ids(routing: Routing, events: list[CloudEvent]) -> dict[str, list[str]]:
    plan = routing.plan(events)
    return {sink: [events[i].id for i, _ in items] for sink, items in plan.by_sink.items()}


def test_every_matching_route_gets_the_event_and_the_default_only_the_rest() -> None:
    routing = Routing(
        {"a": None, "b": None, "c": None},
        [
            Route("routes[0]", ("a", "b"), when=lambda e: e.type == "x"),
            Route("routes[1]", ("b",), when=lambda e: e.data["i"] > 1),
            Route("routes[2]", ("c",)),
        ],
    )
    events = [ev(0, type="x"), ev(1), ev(2, type="x"), ev(3)]
    assert plan_ids(routing, events) == {
        "a": ["e0", "e2"],
        "b": ["e0", "e2", "e3"],  # e2 matched two routes naming b: it goes to b once
        "c": ["e1"],
    }


def test_without_a_default_route_unmatched_outputs_are_unrouted_and_errors_named() -> None:
    def boom(e: CloudEvent) -> bool:
        if e.data["i"] == 2:
            raise KeyError("amount")
        return e.data["i"] == 0

    routing = Routing({"a": None}, [Route("routes[0]", ("a",), when=boom)])
    plan = routing.plan([ev(0), ev(1), ev(2)])
    assert [i for i, _ in plan.by_sink["a"]] == [0]
    assert plan.unrouted == [1]
    assert str(plan.errors[2]) == "routes[0].when: KeyError: 'amount'"


def _parts(routing: Routing, dlq: ListSink) -> tuple[BatchMaker, Delivery, dict[str, int]]:
    stats = dict.fromkeys(STATS, 0)
    stats.update(too_large=0, dead_letters_truncated=0, dead_letters_lost=0, unrouted=0)
    config = KafkaSourceConfig(topic="in")
    sinks = SourceSinks(next(iter(routing.sinks.values())), dlq, routing)
    delivery = Delivery(config, "p", sinks, DeliveryPolicy(retry_initial_s=0.001), stats)
    return BatchMaker(config, False, delivery.undecodable), delivery, stats


def _batch(maker: BatchMaker, offsets: range) -> KafkaBatch:
    records = [
        ConsumerRecord(
            "in",
            0,
            o,
            1000 + o,
            0,
            b"k",
            orjson.dumps({"n": o}),
            None,
            0,
            0,
            [
                ("ce_specversion", b"1.0"),
                ("ce_source", b"/s"),
                ("ce_type", b"t"),
                ("ce_id", f"e{o}".encode()),
            ],
        )
        for o in offsets
    ]
    batch = maker.make({TP: records})
    assert batch is not None
    return batch


class GatedSink(ListSink):
    """Takes nothing until ``gate`` is set (a sink that is down)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def send(self, items: Any) -> None:
        await self.gate.wait()
        await super().send(items)


async def _until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_a_blocked_sink_holds_back_only_its_own_deliveries_and_keeps_batch_order() -> None:
    fast, slow = ListSink(), GatedSink()
    routing = Routing(
        {"fast": fast, "slow": slow},
        [Route("routes[0]", ("fast", "slow"), ordered=True)],  # both sinks keep batch order
    )
    maker, delivery, stats = _parts(routing, ListSink())
    b1, b2 = _batch(maker, range(3)), _batch(maker, range(3, 6))
    t1, t2 = delivery.reserve(), delivery.reserve()

    async def deliver(batch: KafkaBatch, turn: Any) -> None:
        items = [(i, [e], 1) for i, e in enumerate(batch.events)]
        await delivery.send(batch, items, [], turn, last=True)
        turn.release()

    second = asyncio.create_task(deliver(b2, t2))  # the later batch is dispatched first
    first = asyncio.create_task(deliver(b1, t1))
    await _until(lambda: len(fast.events) == 6)  # both batches reached the healthy sink
    assert [e.id for e in fast.events] == [f"e{i}" for i in range(6)]  # in batch order
    assert slow.events == [] and not first.done() and not second.done()
    slow.gate.set()
    await asyncio.gather(first, second)
    assert [e.id for e in slow.events] == [f"e{i}" for i in range(6)]  # batch order kept
    assert stats["outputs"] == 12


async def test_a_refusal_dead_letters_the_input_for_that_sink_only() -> None:
    class RefusingSink(ListSink):
        async def send(self, items: Any) -> None:
            refused = {
                i: ("HttpStatusError", "400 Bad Request")
                for i, (e, _) in enumerate(items)
                if e.id == "e1"
            }
            await super().send([x for i, x in enumerate(items) if i not in refused])
            if refused:
                attrs = {i: {"ebhttpstatus": 400, "ebhttpbody": "no"} for i in refused}
                raise SinkPartialError("hook", refused, [], "refused", None, attrs)

    other, hook, dlq = ListSink(), RefusingSink(), ListSink()
    routing = Routing({"hook": hook, "other": other}, [Route("routes[0]", ("hook", "other"))])
    maker, delivery, stats = _parts(routing, dlq)
    batch = _batch(maker, range(3))
    await delivery.send(
        batch, [(i, [e], 1) for i, e in enumerate(batch.events)], [], delivery.reserve()
    )
    assert [e.id for e in other.events] == ["e0", "e1", "e2"]
    assert [e.id for e in hook.events] == ["e0", "e2"]
    [dead] = dlq.events
    assert (dead.id, dead["ebsink"], dead["ebhttpstatus"], dead["ebstep"]) == (
        "e1",
        "hook",
        400,
        "sink",
    )
    assert (stats["failed"], stats["dead_lettered"], stats["outputs"]) == (1, 1, 5)


async def test_route_errors_are_dead_lettered_and_unrouted_outputs_counted() -> None:
    def when(e: CloudEvent) -> bool:
        if e.id == "e2":
            raise ValueError("no such key 'amount'")
        return e.id == "e0"

    a, dlq = ListSink(), ListSink()
    routing = Routing({"a": a}, [Route("routes[0]", ("a",), when=when)])
    maker, delivery, stats = _parts(routing, dlq)
    batch = _batch(maker, range(3))
    await delivery.send(
        batch, [(i, [e], 1) for i, e in enumerate(batch.events)], [], delivery.reserve()
    )
    assert [e.id for e in a.events] == ["e0"]
    assert stats["unrouted"] == 1
    [dead] = dlq.events
    assert (dead.id, dead["ebstep"], dead["eberrortype"]) == ("e2", "routes[0]", "RouteError")
    assert "no such key 'amount'" in dead["eberror"]


async def test_replies_of_an_http_subscriber_go_on_to_the_next_sink(receiver_factory) -> None:
    def behaviour(req: Received, n: int) -> Reply:
        i = int(req.headers["ce-id"][1:])
        if i == 0:  # a reply: a binary-mode CloudEvent
            head = [
                ("ce-specversion", "1.0"),
                ("ce-id", "r0"),
                ("ce-source", "/sub"),
                ("ce-type", "t.reply"),
                ("content-type", "application/json"),
            ]
            return Reply(200, headers=head, body=b'{"enriched": true}')
        if i == 1:  # acknowledged without a reply
            return Reply(204)
        return Reply(
            200, headers=[("content-type", "application/cloudevents+json")], body=b"{not json"
        )

    r = receiver_factory(behaviour)
    hook = HttpSink(HttpSinkConfig(url=r.url, reply=True))
    store, dlq = ListSink(), ListSink()
    routing = Routing(
        {"hook": hook, "store": store},
        [Route("routes[0]", ("hook", "store"), replies={"hook": "store"})],
    )
    maker, delivery, stats = _parts(routing, dlq)
    await delivery.start()
    try:
        batch = _batch(maker, range(3))
        items = [(i, [e], 1) for i, e in enumerate(batch.events)]
        await delivery.send(batch, items, [], delivery.reserve())
    finally:
        await delivery.stop_sinks()
    assert r.ids() == ["e0", "e1", "e2"]
    [reply] = store.events  # the event itself does not go to store: only hook's replies
    assert (reply.id, reply.type, reply.data) == ("r0", "t.reply", {"enriched": True})
    [dead] = dlq.events  # a 2xx claiming a CloudEvent that is not one
    assert (dead.id, dead["eberrortype"], dead["ebsink"]) == ("e2", "ReplyError", "hook")
    assert hook.take_replies(list(batch.events)) == [None, None, None]  # all taken


def test_reply_needs_one_event_per_request() -> None:
    with pytest.raises(ValueError, match="reply: true takes one event per request"):
        HttpSinkConfig(url="http://127.0.0.1:1/h", reply=True, mode="batch")


async def test_a_reply_over_max_reply_bytes_is_cut_off_and_refused_fast(receiver_factory) -> None:
    head = [("ce-specversion", "1.0"), ("ce-id", "r"), ("ce-source", "/s"), ("ce-type", "t")]
    r = receiver_factory(lambda req, n: Reply(200, headers=head, body_size=20 * 1024 * 1024))
    sink = HttpSink(HttpSinkConfig(url=r.url, reply=True, max_reply_bytes=4096, timeout_s=5))
    await sink.start()
    try:
        items = [(ev(0), None)]
        started = time.monotonic()
        await sink.send(items)
        [reply] = sink.take_replies([items[0][0]])
    finally:
        await sink.stop()
    assert time.monotonic() - started < 10  # 20 MB not read: the connection is dropped
    assert (
        str(reply)
        == f"http sink {r.url} answered with a reply that cannot be used: larger than max_reply_bytes=4096"
    )


async def test_outputs_a_replica_encoded_reach_a_structured_sink_as_events() -> None:
    from types import SimpleNamespace

    from eventbus.eventing._codecs import KafkaRecord, encode_kafka_binary

    structured, binary = ListSink(), ListSink()
    structured.config = SimpleNamespace(mode="structured")  # type: ignore[attr-defined]
    routing = Routing({"s": structured, "b": binary}, [Route("routes[0]", ("s", "b"))])
    maker, delivery, _ = _parts(routing, ListSink())
    batch = _batch(maker, range(2))
    records = [KafkaRecord(*encode_kafka_binary(e), None) for e in batch.events]  # type: ignore[arg-type]
    items = [(i, [r], 1) for i, r in enumerate(records)]
    await delivery.send(batch, items, [], delivery.reserve())  # type: ignore[arg-type]
    assert [type(e) for e in structured.events] == [CloudEvent, CloudEvent]
    assert [e.id for e in structured.events] == ["e0", "e1"]
    assert binary.events == records  # a binary Kafka sink sends them as they are
