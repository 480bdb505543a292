"""Nothing retries forever, on the real broker: a record too large for the sink and a batch
whose dispatch raises for one event are dead-lettered, and their partitions move on."""

from __future__ import annotations

import orjson
import pytest

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.eventing.sources._kafka_dead import TRUNCATED_DATA_BYTES
from tests.integration.test_kafka_source import (
    committed_offsets,
    decode_record,
    make_source,
    produce,
    read_all,
    run_until_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

#: Over the sink's per-record limit (1 MiB - 32 KiB), under the consumer's fetch size (1 MiB).
HUGE = 1_040_000


async def test_records_too_large_for_the_sink_are_dead_lettered_and_committed_past(
    kafka_bootstrap, topic_factory
):
    src = topic_factory("in", partitions=1)
    out = topic_factory("out", partitions=1)
    dlq = topic_factory("dlq", partitions=1)
    records = [(0, None, orjson.dumps({"n": i}), []) for i in range(20)]
    huge_input = orjson.dumps({"n": 20, "pad": "y" * HUGE})
    records.append((0, None, huge_input, []))
    records += [(0, None, orjson.dumps({"n": i}), []) for i in range(21, 30)]
    await produce(kafka_bootstrap, src, records)

    async def inflate(events: list[CloudEvent]) -> list[Outcome]:
        # n == 5 grows to 2 MB (its input is small); n == 20 is over the limit as it came.
        return [
            [e.replace(data={"n": 5, "pad": "x" * 2_000_000})] if e.data["n"] == 5 else [e]
            for e in events
        ]

    source = make_source(kafka_bootstrap, src, inflate, out, dlq, pipeline=f"p-{src}")
    await run_until_committed(source, 30)

    got = await read_all(kafka_bootstrap, out, 28)
    assert [orjson.loads(r.value)["n"] for r in got] == [n for n in range(30) if n not in (5, 20)]
    dead = sorted(
        (decode_record(r) for r in await read_all(kafka_bootstrap, dlq, 2)),
        key=lambda e: e["eboffset"],
    )
    small, cut = dead
    assert small.data == {"n": 5}  # the input, whole: it fits
    assert (small["ebstep"], small["eberrortype"], small["eboffset"]) == (
        "sink",
        "RecordTooLargeError",
        5,
    )
    assert "bytes; a record may have at most" in small["eberror"]
    # The dead letter of the huge input is itself too large: it went cut down.
    assert (cut["ebstep"], cut["eberrortype"], cut["eboffset"]) == (
        "sink",
        "RecordTooLargeError",
        20,
    )
    assert cut["ebsize"] == len(huge_input)
    assert cut["ebtruncated"].startswith("RecordTooLargeError: ")
    assert cut.data == huge_input[:TRUNCATED_DATA_BYTES]
    stats = source.stats()
    assert {k: stats[k] for k in ("outputs", "failed", "dead_lettered", "too_large")} == {
        "outputs": 28,
        "failed": 2,
        "dead_lettered": 2,
        "too_large": 2,
    }
    assert (stats["dead_letters_truncated"], stats["dead_letters_lost"]) == (1, 0)
    assert await committed_offsets(kafka_bootstrap, source.group, src, 1) == {0: 30}


async def test_a_dispatch_that_raises_for_one_event_dead_letters_it_alone(
    kafka_bootstrap, topic_factory
):
    src = topic_factory("in", partitions=2)
    out = topic_factory("out", partitions=1)
    dlq = topic_factory("dlq", partitions=1)
    await produce(
        kafka_bootstrap, src, [(i % 2, None, orjson.dumps({"n": i}), []) for i in range(200)]
    )

    async def choke(events: list[CloudEvent]) -> list[Outcome]:
        if any(e.data["n"] == 77 for e in events):
            raise TypeError("cannot serialise event 77")  # the same on every try
        return [[e] for e in events]

    source = make_source(kafka_bootstrap, src, choke, out, dlq, pipeline=f"p-{src}")
    await run_until_committed(source, 200)

    got = await read_all(kafka_bootstrap, out, 199)
    assert sorted(orjson.loads(r.value)["n"] for r in got) == [n for n in range(200) if n != 77]
    [dead] = [decode_record(r) for r in await read_all(kafka_bootstrap, dlq, 1)]
    assert dead.data == {"n": 77}
    assert (dead["ebstep"], dead["eberrortype"]) == ("dispatch", "TypeError")
    assert "cannot serialise event 77" in dead["eberror"]
    stats = source.stats()
    assert (stats["poison"], stats["failed"], stats["dead_lettered"]) == (1, 1, 1)
    assert await committed_offsets(kafka_bootstrap, source.group, src, 2) == {0: 100, 1: 100}
