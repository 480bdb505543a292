"""The second scenario of ``peers.py``: a tumbling count per key (``--scenario tumbling_count``).

``--events`` events over ``WINDOWS`` (100) one-second windows of event time, keys
``k0..k99``, on a topic of one partition (one watermark orders every window, for every
system: as ``aggregate.py`` does), the Kafka timestamp and the ``ce_time`` header both the event's time;
then one event far ahead (key ``~end``) that closes every window. Each system writes one
record per (key, window) when the window closes:

* EventBus: the ``aggregate`` step (``{n: count}``, state in Redis), one replica;
* Quix Streams: ``tumbling_window(...).count().final(closing_strategy="partition")``;
* Bytewax: ``count_window`` with an ``EventClock`` on the Kafka timestamp and a
  ``TumblingWindower``;
* Faust: a ``tumbling(...)`` table with ``on_window_close``.

Every round's outputs are read back and compared with the answer computed here: each
(key, window) once, with its count. Throughput: the events processed between the first output
and the last (all but the first window's; Bytewax's, see ``BYTEWAX_WAIT_S``) over the span
between their arrivals at the tail clock, as ``aggregate.py`` times it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

KEYS = 100
WINDOWS = 100
WINDOW_MS = 1000
# Bytewax's EventClock moves its watermark on with the wall clock between events (the latest
# event time - the wait + the system time since that event): with a wait of 0 a process that
# stalls for a window's length on this loaded machine closes that window before its last
# events (which go to its late stream). 2 s of wait: its windows close 2 windows of event time
# later than the others', counted in busy_events.
BYTEWAX_WAIT_S = 2
T0 = 1_700_000_000_000  # a whole second: the first window's start
END_KEY = "~end"
SYSTEMS = ("eventbus_1", "quixstreams", "bytewax", "faust")
NOTES = {
    "faust": "Faust closes a window by the wall clock (faust/tables/base.py _del_old_keys: "
    "window.stale(end, time.time())), not by the stream's time: over a backlog whose event "
    "times lie in the past every window is stale at the first cleanup and closes with the "
    "count so far; its later events open the window again, which is not emitted",
}

PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources: [{{kafka: {{topic: {src}}}}}]
  steps:
    - id: per_key
      aggregate:
        key: data.k
        window: {{tumbling: {{size_s: 1}}}}
        aggregations: {{n: count}}
        idle_timeout_s: 60
  sink: {{kafka: {{topic: {sink}}}}}
  serving: {{replicas: {replicas}, batch: {{max_size: 2000}}}}
"""
# idle_timeout_s: 60, as aggregate.py: the peers have no wall-clock watermark, and on a loaded
# machine a replica may stall longer than the default 5 s (the clock would then close the
# backlog's windows early)


def make_events(n: int) -> list[tuple[str, int]]:
    """(key, event time ms) in time order over ``WINDOWS`` windows; then one far ahead."""
    out = [(f"k{(i * 7919) % KEYS}", T0 + i * WINDOWS * WINDOW_MS // n) for i in range(n)]
    out.append((END_KEY, T0 + (WINDOWS + 100) * WINDOW_MS))
    return out


def answer(events: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The count of each (key, window start ms) but the closing event's."""
    return dict(Counter((k, t - t % WINDOW_MS) for k, t in events if k != END_KEY))


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


async def produce(bootstrap: str, topic: str, events: list[tuple[str, int]]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=512 * 1024
    )
    await producer.start()
    try:
        batch, futs = producer.create_batch(), []
        for i, (k, t) in enumerate(events):
            headers = [
                ("ce_specversion", b"1.0"),
                ("ce_id", f"w{i}".encode()),
                ("ce_source", b"/shop"),
                ("ce_type", b"payment.created"),
                ("ce_time", iso(t).encode()),
                ("content-type", b"application/json"),
            ]
            record = {
                "key": k.encode(),
                "value": orjson.dumps({"k": k, "amount": i % 400}),
                "timestamp": t,
                "headers": headers,
            }
            if batch.append(**record) is None:
                futs.append(await producer.send_batch(batch, topic, partition=0))
                batch = producer.create_batch()
                batch.append(**record)
        futs.append(await producer.send_batch(batch, topic, partition=0))
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


def window_of(key: bytes | None, value: bytes) -> tuple[str, int, int]:
    """(key, window start ms, count) of one output, whichever system wrote it.

    EventBus: ``{"key", "window_start": ISO, "n"}``; Quix: ``{"start", "end", "value"}`` keyed by
    the key; Bytewax and Faust (written here): ``{"key", "start", "n"}``.
    """
    data = orjson.loads(value)
    k = data.get("key", key.decode() if key is not None else None)
    if "window_start" in data:
        start = data["window_start"]
        ms = int(datetime.fromisoformat(start.replace("Z", "+00:00")).timestamp() * 1000)
    else:
        ms = int(data["start"])
    return str(k), ms, int(data["n"] if "n" in data else data["value"])


async def verify(
    bootstrap: str, sink: str, expect: dict[tuple[str, int], int], name: str, *, cut: bool
) -> int:
    """Read ``sink`` back and compare with ``expect``: every (key, window) once with its count
    (``cut``: the round was cut short, so only those that came out, each right).

    Returns:
        How many windows came out.

    Raises:
        RuntimeError: a window missing, repeated, unexpected or with a wrong count.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    consumer.assign([TopicPartition(sink, 0)])
    got: dict[tuple[str, int], int] = {}
    repeated: list[tuple[str, int]] = []
    deadline = time.monotonic() + 60
    try:
        # Tansu's end offsets are its last batch's base offset: read until the topic is quiet
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=20000)
            if not batch and (cut or len(got) >= len(expect)):
                break
            for records in batch.values():
                for r in records:
                    k, start, n = window_of(r.key, r.value)
                    if k == END_KEY:  # its window closes only once the input is idle
                        continue
                    if (k, start) in got:
                        repeated.append((k, start))
                    got[(k, start)] = n
    finally:
        await consumer.stop()
    wrong = [(w, n, expect.get(w)) for w, n in got.items() if expect.get(w) != n]
    missing = [] if cut else sorted(expect.keys() - got.keys())
    if wrong or missing or repeated:
        msg = (
            f"{name}: {len(got)} windows out of {len(expect)}: {len(wrong)} with a wrong count "
            f"(window, count, expected), e.g. {wrong[:3]}; {len(missing)} missing, e.g. "
            f"{missing[:3]}; {len(repeated)} repeated, e.g. {repeated[:3]}"
        )
        raise RuntimeError(msg)
    return len(got)


def report(results: dict[str, dict[str, Any]], n: int) -> dict[str, Any]:
    """The scenario's part of the JSON line: figures, EventBus's ratio to each peer."""
    rate = {k: v.get("events_per_s") for k, v in results.items()}
    eb = rate.get("eventbus_1")
    peers = [rate[k] for k in SYSTEMS[1:] if rate.get(k)]
    best = max(peers, default=None)
    return {
        "notes": NOTES,
        "events": n,
        "keys": KEYS,
        "windows": WINDOWS,
        "outputs_per_round": KEYS * WINDOWS,
        "systems": results,
        "ratios": {
            f"eventbus_1_vs_{k}": round(eb / r, 3) if eb and r else None
            for k, r in rate.items()
            if k != "eventbus_1"
        },
        "targets": {
            "eventbus_vs_best_framework": round(eb / best, 3) if eb and best else None,
            "eventbus_vs_best_framework_target": 2.0,
        },
    }


def busy_events(n: int, name: str) -> float:
    """Events processed between the first output and the last: all but those read before the
    first window closed (the first window's; Bytewax's, its wait's windows more)."""
    before_first = 1 + (BYTEWAX_WAIT_S * 1000 // WINDOW_MS if name == "bytewax" else 0)
    return n * (WINDOWS - before_first) / WINDOWS
