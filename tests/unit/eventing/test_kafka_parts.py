"""The Kafka source's parts without a broker: batches, retry scheduling and delivery."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from eventbus.eventing._codecs import RawRecord
from eventbus.eventing._delivery import RetryPolicy
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure, Outcome
from eventbus.eventing.sinks import Sink, SinkTooLargeError
from eventbus.eventing.sources import (
    DECODE_ERROR_TYPE,
    DeliveryPolicy,
    KafkaSourceConfig,
    SourceSinks,
)
from eventbus.eventing.sources._kafka_batch import BatchMaker
from eventbus.eventing.sources._kafka_dead import TRUNCATED_DATA_BYTES
from eventbus.eventing.sources._kafka_delivery import Delivery
from eventbus.eventing.sources._kafka_errors import SourceStalledError, is_infrastructure
from eventbus.eventing.sources._kafka_retry import (
    EarlierBatchFailedError,
    EventRetries,
    Redispatcher,
)
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
    stats.update(too_large=0, dead_letters_truncated=0, dead_letters_lost=0)
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
        "too_large": 0,
        "dead_letters_truncated": 0,
        "dead_letters_lost": 0,
    }


def test_event_retries_dispatch_failures_again_until_they_settle() -> None:
    stats = {"dispatch_retries": 0, "retries": 0, "poison": 0}
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
    assert stats == {"dispatch_retries": 0, "retries": 2 + 2 + 1, "poison": 0}

    no_retries = EventRetries(None, Redispatcher(dispatch, policy, "p", stats), stats)
    settled, pending = no_retries.split([[0], Failure("s", "E", "x")])
    assert (len(list(settled)), pending) == (2, [])


def test_redispatch_retries_a_raising_dispatch_and_checks_the_outcome_count() -> None:
    stats = {"dispatch_retries": 0, "poison": 0}
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


def test_in_order_dispatch_stays_pipelined_while_nothing_fails() -> None:
    """``FetchSettings.in_order`` costs nothing on the happy path: batch 2's dispatch starts
    while batch 1's is still running."""
    stats = {"dispatch_retries": 0, "poison": 0}
    release = asyncio.Event()
    started: list[int] = []

    async def dispatch(events: list[Any]) -> list[Outcome]:
        started.append(events[0])
        if events[0] == 1:
            await release.wait()  # batch 1 still in flight (a Serve call, a worker thread)
        return [[e] for e in events]

    redispatch = Redispatcher(dispatch, DeliveryPolicy(), "p", stats)

    async def two() -> list[list[Outcome]]:
        first = asyncio.create_task(redispatch.after(None, [1], 1))
        second = asyncio.create_task(redispatch.after(first, [2], 2))
        while len(started) < 2:
            await asyncio.sleep(0)
        release.set()
        return list(await asyncio.gather(first, second))

    assert asyncio.run(two()) == [[[1]], [[2]]]
    assert started == [1, 2]


def test_in_order_dispatch_waits_for_the_batch_before_through_its_retries() -> None:
    """``FetchSettings.in_order``: a batch whose dispatch fails and is retried keeps the
    batches after it waiting (first tries and retries), so state sees them in order."""
    stats = {"dispatch_retries": 0, "poison": 0}
    ran: list[int] = []
    failures = {1: 2}  # batch 1 fails twice (Redis restarting), then runs

    async def dispatch(events: list[Any]) -> list[Outcome]:
        if failures.get(events[0], 0):
            failures[events[0]] -= 1
            raise ConnectionError("Redis is restarting")
        ran.append(events[0])
        return [[e] for e in events]

    redispatch = Redispatcher(dispatch, DeliveryPolicy(retry_initial_s=0.01), "p", stats)

    async def three() -> list[list[Outcome]]:
        first = asyncio.create_task(redispatch.after(None, [1], 1))
        second = asyncio.create_task(redispatch.after(first, [2], 2))
        third = asyncio.create_task(redispatch.after(second, [3], 3))
        return list(await asyncio.gather(first, second, third))

    assert asyncio.run(three()) == [[[1]], [[2]], [[3]]]
    assert ran == [1, 2, 3]
    assert stats["dispatch_retries"] == 2

    async def after_a_failure() -> None:
        ran.clear()
        failures[1] = 1_000  # batch 1 is retried until give_up_s, then its source stops

        policy = DeliveryPolicy(retry_initial_s=0.01, give_up_s=0.05)
        stalling = Redispatcher(dispatch, policy, "p", stats)
        before = asyncio.create_task(stalling.after(None, [1], 1))
        await asyncio.sleep(0)  # its first try failed: it is held
        with pytest.raises(EarlierBatchFailedError, match=r"batch 2 was not dispatched"):
            await stalling.after(before, [2], 2)
        with pytest.raises(SourceStalledError):
            await before
        assert ran == []  # the batch after a failed one never changes state ahead of it

    asyncio.run(after_a_failure())


# -- nothing retries forever ----------------------------------------------------------------


def test_a_poison_event_that_makes_dispatch_raise_is_isolated_and_failed_alone() -> None:
    stats = {"dispatch_retries": 0, "poison": 0}
    calls: list[list[int]] = []

    async def dispatch(events: list[Any]) -> list[Outcome]:
        calls.append(list(events))
        if 13 in events:
            raise ValueError("cannot pickle event 13")
        return [[n] for n in events]

    policy = DeliveryPolicy(retry_initial_s=0.001, dispatch_retries=2)
    outcomes = asyncio.run(Redispatcher(dispatch, policy, "p", stats)(list(range(32)), 1))
    failure = outcomes[13]
    assert isinstance(failure, Failure)
    assert (failure.step, failure.error_type) == ("dispatch", "ValueError")
    assert "cannot pickle event 13" in failure.message
    assert "dead-lettered and its partition moves on" in failure.message
    assert outcomes[:13] + outcomes[14:] == [[n] for n in range(32) if n != 13]
    assert stats["poison"] == 1
    # 3 tries of the whole batch, then one split per level (log2 32 = 5): bounded.
    assert len(calls) == 3 + 2 * 5


def test_an_infrastructure_error_is_retried_until_give_up_s_then_the_source_stalls() -> None:
    stats = {"dispatch_retries": 0, "poison": 0}

    async def down(events: list[Any]) -> list[Outcome]:
        raise ConnectionError("replica unreachable")

    policy = DeliveryPolicy(retry_initial_s=0.001, retry_max_s=0.001, give_up_s=0.05)
    with pytest.raises(SourceStalledError, match="dispatch kept failing for 0 s") as info:
        asyncio.run(Redispatcher(down, policy, "p", stats)(["a", "b"], 1))
    assert "ConnectionError: replica unreachable" in str(info.value)
    assert stats["dispatch_retries"] > 3
    assert stats["poison"] == 0  # nothing dead-lettered for an outage


def test_errors_are_classified_infrastructure_or_not() -> None:
    from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError

    from eventbus.errors import StateUnavailableError

    class ActorDiedError(Exception):  # Ray's, by name: eventing does not import Ray
        pass

    for error in (
        ConnectionError(),
        TimeoutError(),
        StateUnavailableError("redis"),
        KafkaConnectionError(),
        ActorDiedError(),
    ):
        assert is_infrastructure(error), error
    for error in (ValueError(), TypeError(), MessageSizeTooLargeError(), KeyError("x")):
        assert not is_infrastructure(error), error


def _size(data: Any) -> bytes:
    return data if isinstance(data, bytes) else orjson.dumps(data)


class RefusingSink(Sink):
    """Refuses (too large, without saying which) any send holding an event over ``limit``
    bytes of data; records what it accepted."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.events: list[CloudEvent] = []
        self.calls = 0

    async def send(self, items: Any) -> None:
        self.calls += 1
        if any(len(_size(e.data)) > self.limit for e, _ in items):
            raise SinkTooLargeError("kafka topic 'x'", "MessageSizeTooLargeError: [Error 10]")
        self.events.extend(e for e, _ in items)


def test_outputs_too_large_dead_letter_their_inputs_and_too_large_dead_letters_are_cut() -> None:
    stats: dict[str, int] = dict.fromkeys(("decode_errors", "outputs", "dropped", "failed"), 0)
    stats.update(dead_lettered=0, duplicates=0)
    stats.update(too_large=0, dead_letters_truncated=0, dead_letters_lost=0)
    sink, dlq = RefusingSink(limit=1000), RefusingSink(limit=70_000)
    config = KafkaSourceConfig(topic="in")
    delivery = Delivery(config, "p", SourceSinks(sink, dlq), DeliveryPolicy(), stats)
    maker = BatchMaker(config, False, delivery.undecodable)
    big_input = record(3, orjson.dumps({"n": 3, "pad": "y" * 100_000}), (*CE, ("ce_id", b"e3")))
    batch = maker.make({TP: [good(0), good(1), good(2), big_input, good(4)]})
    assert batch is not None

    def grow(e: CloudEvent) -> CloudEvent:
        return e.replace(data={"n": e.data["n"], "pad": "x" * 2000})

    outcomes: list[Outcome] = [[e] for e in batch.events]  # type: ignore[misc]
    outcomes[1] = [grow(batch.events[1])]  # type: ignore[arg-type]
    outcomes[3] = [grow(batch.events[3])]  # type: ignore[arg-type]
    asyncio.run(delivery.send(batch, [(i, o, 1) for i, o in enumerate(outcomes)], []))

    assert [e.data["n"] for e in sink.events] == [0, 2, 4]
    whole, cut = dlq.events
    assert whole.data == {"n": 1}  # the input, as it came
    assert (whole["ebstep"], whole["eberrortype"], whole["eboffset"]) == (
        "sink",
        "RecordTooLargeError",
        1,
    )
    assert "rejected a send as too large" in whole["eberror"]
    # The dead letter of the big input was refused too: it went again cut down.
    assert (cut.id, cut["eboffset"], cut["eberrortype"]) == ("e3", 3, "RecordTooLargeError")
    assert cut["ebtruncated"].startswith("RecordTooLargeError: kafka topic 'x' rejected")
    assert cut["ebsize"] == len(orjson.dumps({"n": 3, "pad": "y" * 100_000}))
    assert cut.data == orjson.dumps({"n": 3, "pad": "y" * 100_000})[:TRUNCATED_DATA_BYTES]
    assert {k: stats[k] for k in ("outputs", "failed", "too_large", "dead_lettered")} == {
        "outputs": 3,
        "failed": 2,
        "too_large": 2,
        "dead_lettered": 2,
    }
    assert (stats["dead_letters_truncated"], stats["dead_letters_lost"]) == (1, 0)


def test_a_sink_failing_forever_stalls_the_source_after_give_up_s() -> None:
    class DownSink(Sink):
        async def send(self, items: Any) -> None:
            raise ConnectionError("broker down")

    stats: dict[str, int] = dict.fromkeys(("decode_errors", "outputs", "dropped", "failed"), 0)
    stats.update(dead_lettered=0, duplicates=0)
    config = KafkaSourceConfig(topic="in")
    policy = DeliveryPolicy(retry_initial_s=0.001, retry_max_s=0.001, give_up_s=0.05)
    delivery = Delivery(config, "p", SourceSinks(DownSink()), policy, stats)
    batch = BatchMaker(config, False, delivery.undecodable).make({TP: [good(0)]})
    assert batch is not None
    with pytest.raises(SourceStalledError, match="sink kept failing"):
        asyncio.run(delivery.send(batch, [(0, [batch.events[0]], 1)], []))  # type: ignore[list-item]
    assert stats["outputs"] == 0


def test_a_revocation_waits_for_the_drain_only_revoke_timeout_s() -> None:
    from eventbus.eventing.sources import FetchSettings, KafkaSource

    async def dispatch(events: list[Any]) -> list[Outcome]:
        return [[e] for e in events]

    source = KafkaSource(
        KafkaSourceConfig(topic="in"),
        pipeline="p",
        bootstrap_servers="127.0.0.1:1",
        dispatch=dispatch,
        sinks=SourceSinks(ListSink()),
        fetch=FetchSettings(revoke_timeout_s=0.05),
    )

    async def run() -> float:
        stuck = asyncio.Event()  # a delivery that never finishes (a sink that hangs)
        source._deliverer = asyncio.create_task(stuck.wait())
        batch = BatchMaker(KafkaSourceConfig(topic="in"), False, lambda r, e: (None, None))
        source._queue.append(batch.make({TP: [good(0)]}))  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(source._on_revoked({TP}), 5)
        elapsed = loop.time() - started
        source._deliverer.cancel()
        return elapsed

    elapsed = asyncio.run(run())
    # it waited its revoke timeout, then gave up (one that waited for the stuck delivery would
    # raise the wait_for's TimeoutError above)
    assert elapsed >= 0.05
    assert source.stats()["revoke_timeouts"] == 1
    assert not source._revoking  # fetching resumes
