"""The Kafka source's parts without a broker: batches, retry scheduling and delivery."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from eventbus.eventing._codecs import RawRecord
from eventbus.eventing._delivery import RetryPolicy
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure, Outcome
from eventbus.eventing.sources import (
    DECODE_ERROR_TYPE,
    DeliveryPolicy,
    KafkaSourceConfig,
    SourceSinks,
)
from eventbus.eventing.sources._kafka_batch import BatchMaker
from eventbus.eventing.sources._kafka_delivery import Delivery
from eventbus.eventing.sources._kafka_retry import EventRetries, Redispatcher
from eventbus.testing import ListSink

TP = TopicPartition("in", 0)
CE = [("ce_specversion", b"1.0"), ("ce_source", b"/s"), ("ce_type", b"t")]


def record(offset: int, value: bytes | None, headers: Any = (), key: bytes | None = None) -> Any:
    return ConsumerRecord("in", 0, offset, 1000 + offset, 0, key, value, None, 0, 0, headers)


def good(offset: int) -> Any:
    return record(offset, orjson.dumps({"n": offset}), (*CE, ("ce_id", f"e{offset}".encode())))


def bad(offset: int) -> Any:  # ce_ headers without ce_specversion: not a valid CloudEvent
    return record(offset, b"\x00raw", (("ce_id", b"x"),), key=b"k")


def parts(
    *, decode_in_dispatch: bool = False, dead_letter: bool = True
) -> tuple[BatchMaker, Delivery, ListSink, ListSink, dict[str, int]]:
    stats: dict[str, int] = dict.fromkeys(("decode_errors", "outputs", "dropped", "failed"), 0)
    stats.update(dead_lettered=0, duplicates=0)
    sink, dlq = ListSink(), ListSink()
    config = KafkaSourceConfig(topic="in")
    delivery = Delivery(
        config, "p", SourceSinks(sink, dlq if dead_letter else None), DeliveryPolicy(), stats
    )
    return BatchMaker(config, decode_in_dispatch, delivery.undecodable), delivery, sink, dlq, stats


def test_a_batch_decodes_and_dead_letters_undecodable_records_with_raw_bytes() -> None:
    maker, _, _, _, stats = parts()
    batch = maker.make({TP: [good(5), bad(6), good(7)]})
    assert batch is not None
    assert (batch.seq, batch.count, batch.offsets, batch.oldest_ms) == (1, 3, {TP: 8}, 1005)
    assert [e.id for e in batch.events] == ["e5", "e7"]  # type: ignore[union-attr]
    assert [r.offset for r in batch.records] == [5, 7]
    [(dead, key)] = batch.dead
    assert key == b"k"
    assert dead.data == b"\x00raw"
    assert dead.attributes["type"] == DECODE_ERROR_TYPE
    assert {k: v for k, v in dead.attributes.items() if k != "eberror"} == {
        "specversion": "1.0",
        "id": "in-0-6",
        "source": "kafka://in",
        "type": DECODE_ERROR_TYPE,
        "datacontenttype": "application/octet-stream",
        "ebpipeline": "p",
        "ebstep": "decode",
        "eberrortype": "EventDecodeError",
        "ebattempts": 1,
        "ebtopic": "in",
        "ebpartition": 0,
        "eboffset": 6,
    }
    assert dead.attributes["eberror"].startswith("in[0]@6")
    assert stats["decode_errors"] == 1
    assert maker.make({TP: []}) is None
    assert maker.make({TP: [good(8)]}).seq == 2  # type: ignore[union-attr]


def test_records_stay_raw_when_decoding_happens_in_dispatch() -> None:
    maker, _, _, _, stats = parts(decode_in_dispatch=True)
    batch = maker.make({TP: [good(5), bad(6)]})
    assert batch is not None
    assert [type(e) for e in batch.events] == [RawRecord, RawRecord]
    assert batch.events[1] == RawRecord(b"\x00raw", (("ce_id", b"x"),), b"k", "in", 0, 6)
    assert batch.dead == []
    assert stats["decode_errors"] == 0


def test_delivery_sends_outputs_and_dead_letters_failures_and_replica_decode_errors() -> None:
    maker, delivery, sink, dlq, stats = parts(decode_in_dispatch=True)
    batch = maker.make({TP: [good(5), bad(6), good(7), good(8)]})
    assert batch is not None
    outcomes: list[Outcome] = [
        [CloudEvent.create(type="out", source="/s", id="o5")],
        Failure("decode", "EventDecodeError", "in[0]@6: broken"),
        Failure("step1", "ValueError", "no", attempts=1),
        [],
    ]
    items = [(i, o, 3 if i == 2 else 1) for i, o in enumerate(outcomes)]
    asyncio.run(delivery.send(batch, items, list(batch.dead)))
    assert [e.id for e in sink.events] == ["o5"]
    decode_dead, failed = dlq.events
    assert (decode_dead.type, decode_dead.id, decode_dead.data) == (
        DECODE_ERROR_TYPE,
        "in-0-6",
        b"\x00raw",
    )
    assert decode_dead.attributes["eberror"] == "in[0]@6: broken"
    assert failed.id == "e7"  # decoded again from its raw record for the dead letter
    assert failed.data == {"n": 7}
    assert (failed["ebstep"], failed["ebattempts"], failed["eboffset"]) == ("step1", 3, 7)
    assert stats == {
        "decode_errors": 1,
        "outputs": 1,
        "dropped": 1,
        "failed": 1,
        "dead_lettered": 2,
        "duplicates": 0,
    }


def test_event_retries_dispatch_failures_again_until_they_settle() -> None:
    stats = {"dispatch_retries": 0, "retries": 0}
    tries: dict[int, int] = {}

    async def dispatch(events: list[Any]) -> list[Outcome]:
        out: list[Outcome] = []
        for n in events:
            tries[n] = tries.get(n, 0) + 1
            out.append(Failure("s", "E", "x") if n == 2 or (n == 1 and tries[n] < 3) else [n])
        return out

    policy = DeliveryPolicy(retry=RetryPolicy(retries=3, initial_s=0.001, max_s=0.001))
    retries = EventRetries(policy.retry, Redispatcher(dispatch, policy, "p", stats), stats)

    async def run() -> list[list[tuple[int, Outcome, int]]]:
        first = await dispatch([0, 1, 2])
        settled, pending = retries.split(first)
        assert [i for i, _, _ in settled] == [0]
        assert pending == [1, 2]
        return [r async for r in retries.rounds([0, 1, 2], pending, seq=1)]

    rounds = asyncio.run(run())
    assert [[(i, n) for i, _, n in r] for r in rounds] == [[], [(1, 3)], [(2, 4)]]
    assert isinstance(rounds[-1][0][1], Failure)
    assert stats == {"dispatch_retries": 0, "retries": 2 + 2 + 1}

    no_retries = EventRetries(None, Redispatcher(dispatch, policy, "p", stats), stats)
    settled, pending = no_retries.split([[0], Failure("s", "E", "x")])
    assert (len(list(settled)), pending) == (2, [])


def test_redispatch_retries_a_raising_dispatch_and_checks_the_outcome_count() -> None:
    stats = {"dispatch_retries": 0}
    calls = 0

    async def flaky(events: list[Any]) -> list[Outcome]:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("replica died")
        return [[e] for e in events] if calls == 3 else []

    redispatch = Redispatcher(flaky, DeliveryPolicy(retry_initial_s=0.001), "p", stats)
    assert asyncio.run(redispatch(["a"], 1)) == [["a"]]
    assert stats["dispatch_retries"] == 2
    [failure] = asyncio.run(redispatch(["a"], 2))
    assert isinstance(failure, Failure)
    assert (failure.step, failure.error_type) == ("dispatch", "DispatchContractError")
