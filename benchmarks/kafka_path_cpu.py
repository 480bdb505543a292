"""CPU per event of the replica's Kafka batch path, in process, against the hand-written loop's.

The end-to-end benchmark (``kafka_pipeline.py``) shares two cores with the broker and Ray, so
its figures move with whatever else runs on the machine. This one isolates what EventBus adds
per event and measures it the same way for both sides, in one process, without a broker:

* baseline: the per-record work of ``kafka_pipeline.py``'s aiokafka loop (``dict`` of the
  headers, ``orjson`` decode, filter, convert, encode, append to an aiokafka record batch);
* EventBus: the replica's own code over the same records: the source's batching and decoding
  (``BatchMaker``), the steps (``PipelineRunner`` with the benchmark's filter and convert), and
  delivery (``Delivery.send`` into ``KafkaSink.send``, whose producer here only builds the
  aiokafka record batches and acknowledges them at once: no network).

The records are what aiokafka's consumer yields (``ConsumerRecord``) for the events of
``kafka_pipeline.py``. CPU time of this thread (``time.thread_time``) around each stage, the
garbage collector off as in a replica (which collects on a timer), best of ``--rounds`` (the least disturbed run).

Last line: one JSON object with µs per event of each side and of each stage, and ``ratio``
(baseline µs / EventBus µs: the fraction of the loop's throughput that EventBus's per-event
work allows, broker and fetch costs aside).

Run: ``.venv/bin/python benchmarks/kafka_path_cpu.py [--events 100000] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.structs import ConsumerRecord, RecordMetadata, TopicPartition

from eventbus.eventing.sinks._kafka import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources._kafka_batch import BatchMaker
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.eventing.sources._kafka_delivery import Delivery
from eventbus.eventing.sources._kafka_retry import EventRetries
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy, SourceSinks
from eventbus.pipelines._loader import load_pipeline_text
from eventbus.pipelines._runner import PipelineRunner

try:  # the events and pipeline of kafka_pipeline.py, wherever they are defined
    from _common import PARTITIONS, PIPELINE, make_values
except ImportError:
    from kafka_pipeline import PARTITIONS, PIPELINE, make_values

BATCH = 2000
_BATCH_BYTES = 512 * 1024


def records(n: int, topic: str = "in") -> list[ConsumerRecord[bytes, bytes]]:
    """The events of kafka_pipeline.py as the consumer yields them, round-robin partitions."""
    out = []
    for i, (headers, value, key) in enumerate(make_values(n)):
        out.append(
            ConsumerRecord(
                topic,
                i % PARTITIONS,
                i // PARTITIONS,
                0,
                0,
                key,
                value,
                None,
                len(key),
                len(value),
                tuple(headers),
            )
        )
    return out


class _AckingProducer:
    """Builds aiokafka record batches as the real producer does and acknowledges each at once."""

    def __init__(self) -> None:
        self.sent = 0

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(PARTITIONS))

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(_BATCH_BYTES, 0, is_transactional=False)

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> Any:
        self.sent += batch.record_count()
        batch.close()
        batch._build()  # the bytes the producer would write to the socket
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(
            RecordMetadata(
                topic, partition, TopicPartition(topic, partition), self.sent, -1, -1, -1
            )
        )
        return fut


def baseline(recs: list[Any]) -> int:
    """kafka_pipeline.py's hand-written loop, per record (one batch per partition)."""
    outs: dict[int, BatchBuilder] = {}
    n = 0
    for r in recs:
        h = dict(r.headers)
        data = orjson.loads(r.value)
        if (
            h.get("ce_type") == b"payment.created"
            and data["amount"] > 100
            and data["currency"] in ("CNY", "USD")
        ):
            data["amount_cny"] = data["amount"] * 7.1
            h["ce_type"] = b"payment.large"
            hdrs = list(h.items())
            val = orjson.dumps(data)
            out = outs.get(r.partition)
            if out is None:
                out = outs[r.partition] = BatchBuilder(_BATCH_BYTES, 0, is_transactional=False)
            if out.append(key=r.key, value=val, timestamp=None, headers=hdrs) is None:
                out.close()
                out._build()
                out = outs[r.partition] = BatchBuilder(_BATCH_BYTES, 0, is_transactional=False)
                out.append(key=r.key, value=val, timestamp=None, headers=hdrs)
            n += 1
    for out in outs.values():
        out.close()
        out._build()
    return n


class EventBusPath:
    """The replica's per-batch work: make the batch, run the steps, deliver to the sink."""

    def __init__(self) -> None:
        config = load_pipeline_text(PIPELINE.format(name="cpu", src="in", sink="out", replicas=1))
        self.runner = PipelineRunner(config)
        source = KafkaSourceConfig(topic="in")
        self.stats: dict[str, int] = {
            "decode_errors": 0,
            "outputs": 0,
            "dead_lettered": 0,
            "dropped": 0,
            "failed": 0,
            "duplicates": 0,
            "too_large": 0,
        }
        sink = KafkaSink(KafkaSinkConfig(topic="out"), bootstrap_servers="127.0.0.1:1")
        sink._producer = _AckingProducer()
        self.delivery = Delivery(source, "cpu", SourceSinks(sink), DeliveryPolicy(), self.stats)
        self.batches = BatchMaker(source, False, self.delivery.undecodable)
        self.retries = EventRetries(None, None, self.stats)  # type: ignore[arg-type]
        self.seconds = {"batch_and_decode": 0.0, "steps": 0.0, "deliver": 0.0}

    async def run(self, fetches: list[dict[TopicPartition, list[Any]]]) -> None:
        clock = time.thread_time
        secs = self.seconds
        for by_tp in fetches:
            t0 = clock()
            batch = self.batches.make(by_tp)
            assert batch is not None
            t1 = clock()
            outcomes = self.runner.run(batch.events)  # type: ignore[arg-type]
            t2 = clock()
            settled, _ = self.retries.split(outcomes)
            await self.delivery.send(batch, settled, list(batch.dead))
            t3 = clock()
            secs["batch_and_decode"] += t1 - t0
            secs["steps"] += t2 - t1
            secs["deliver"] += t3 - t2


def fetches(recs: list[Any]) -> list[dict[TopicPartition, list[Any]]]:
    """The records in fetches of ``BATCH``, per partition, as ``getmany()`` returns them."""
    out = []
    for i in range(0, len(recs), BATCH):
        by_tp: dict[TopicPartition, list[Any]] = {}
        for r in recs[i : i + BATCH]:
            by_tp.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
        out.append(by_tp)
    return out


def best_of(rounds: int, fn: Any) -> float:
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    n = args.events
    recs = records(n)
    fetched = fetches(recs)
    gc.freeze()
    gc.disable()  # a replica collects on a timer, between batches (see eventbus._internal.gc)
    base_s: list[float] = []
    eb_s: list[float] = []
    stages: list[dict[str, float]] = []
    expect = baseline(recs)
    for _ in range(args.rounds):  # interleaved: both sides see the same machine
        base_s.append(best_of(1, lambda: baseline(recs)))
        path = EventBusPath()
        asyncio.run(path.run(fetched))
        eb_s.append(sum(path.seconds.values()))
        stages.append(path.seconds)
        gc.collect()  # between rounds: a replica collects on a timer (every 5 s)
        assert path.stats["outputs"] == expect, (path.stats, expect)
    best = min(range(len(eb_s)), key=eb_s.__getitem__)
    us = 1e6 / n
    result = {
        "benchmark": "kafka_path_cpu",
        "events": n,
        "outputs": expect,
        "rounds": args.rounds,
        "baseline_us_per_event": round(min(base_s) * us, 3),
        "eventbus_us_per_event": round(eb_s[best] * us, 3),
        "eventbus_stages_us_per_event": {k: round(v * us, 3) for k, v in stages[best].items()},
        "ratio": round(min(base_s) / eb_s[best], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
