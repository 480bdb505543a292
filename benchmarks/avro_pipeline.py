"""Avro → filter + convert → Avro: EventBus on Ray Serve against a confluent-kafka hand loop.

Both sides run the same pipeline over the same pre-produced Avro records (written by
confluent-kafka's ``AvroSerializer`` in the Confluent wire format, schema in EventBus's
registry served on a loopback port, state in a compacted topic of the benchmark's broker):
keep the payments with amount > 100 in CNY or USD, add ``amount_cny``, write them with the
output schema.

* baseline: one process, confluent-kafka (librdkafka): ``consume(2000)`` → ``AvroDeserializer``
  → Python filter/convert → ``AvroSerializer`` → ``produce`` (the input's partition) →
  ``flush`` → synchronous ``commit``: at least once, as EventBus runs;
* EventBus: the pipeline deployed on a local Ray cluster (source ``value_format: avro``, sink
  ``value_format: avro`` with the output schema and its subject), CEL compiled to Python.

Throughput: records consumed per second between the first and last output record (broker
timestamps of the sink records), median of rounds, after an unmeasured warm-up round. Every
output of both sides is read back and checked once per run (the count each round).

Last line: one JSON object with the figures, ``ratio`` (EventBus / baseline records/s), the
target (0.9) and ``broker``.

Run: ``.venv/bin/python benchmarks/avro_pipeline.py [--broker kafka|tansu] [--events 100000]
[--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401 - sets Ray's environment and the import path first
import redis as redis_lib
from _broker import add_broker_arg, start_broker
from _common import PARTITIONS, sink_span, wait_committed
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from eventbus._internal.redis_service import start_redis
from eventbus._internal.services import create_topics

CURRENCIES = ["CNY", "USD", "EUR", "CNY", "USD"]
PAYMENT = {
    "type": "record",
    "name": "Payment",
    "namespace": "shop",
    "fields": [
        {"name": "amount", "type": "long"},
        {"name": "currency", "type": "string"},
        {"name": "order", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
PAYMENT_CNY = {
    "type": "record",
    "name": "PaymentCny",
    "namespace": "shop",
    "fields": [
        {"name": "amount", "type": "long"},
        {"name": "currency", "type": "string"},
        {"name": "order", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "amount_cny", "type": "double"},
    ],
}
PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources:
    - kafka: {{topic: {src}, type: payment, value_format: avro, schema_registry_url: "{url}"}}
  steps:
    - id: only_large
      filter: "data.amount > 100 && data.currency in ['CNY', 'USD']"
    - id: to_cny
      convert: {{set: {{data.amount_cny: "double(data.amount) * 7.1"}}}}
  sink:
    kafka:
      topic: {sink}
      value_format: avro
      schema_registry_url: "{url}"
      subject: {sink}-value
      value_schema: {schema}
  serving: {{replicas: 1, batch: {{max_size: 2000}}}}
"""


def payment(i: int) -> dict[str, Any]:
    return {"amount": (i * 37) % 400, "currency": CURRENCIES[i % 5], "order": i, "note": None}


def expected_outputs(n: int) -> int:
    return sum(1 for i in range(n) if (i * 37) % 400 > 100 and CURRENCIES[i % 5] != "EUR")


def produce_avro(bootstrap: str, url: str, topic: str, n: int) -> None:
    """``n`` Avro payments in the Confluent wire format, keyed by order, over the partitions."""
    with SchemaRegistryClient({"url": url}) as registry:
        ser = AvroSerializer(registry, json.dumps(PAYMENT))
        ctx = SerializationContext(topic, MessageField.VALUE)
        producer = Producer({
            "bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
            "batch.size": 512 * 1024, "queue.buffering.max.messages": 1_000_000,
        })  # fmt: skip
        for i in range(n):
            producer.produce(topic, ser(payment(i), ctx), str(i % 64).encode(), i % PARTITIONS)
            if i % 10_000 == 0:
                producer.poll(0)
        left = producer.flush(120)
    if left:
        msg = f"{left} input records were not acknowledged within 120 s"
        raise RuntimeError(msg)


def baseline(bootstrap: str, url: str, src: str, sink: str, n: int) -> None:
    """The hand loop: consume, deserialize, filter, convert, serialize, produce, commit."""
    with SchemaRegistryClient({"url": url}) as registry:
        de = AvroDeserializer(registry)
        ser = AvroSerializer(registry, json.dumps(PAYMENT_CNY))
        in_ctx = SerializationContext(src, MessageField.VALUE)
        out_ctx = SerializationContext(sink, MessageField.VALUE)
        consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"hand-{src}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
        })  # fmt: skip
        producer = Producer({
            "bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
            "batch.size": 512 * 1024, "queue.buffering.max.messages": 1_000_000,
        })  # fmt: skip
        consumer.subscribe([src])
        seen = 0
        deadline = time.monotonic() + 600
        try:
            while seen < n:
                if time.monotonic() > deadline:
                    msg = f"the hand loop consumed {seen} of {n} records within 600 s"
                    raise RuntimeError(msg)
                batch = consumer.consume(2000, 0.5)
                for m in batch:
                    err = m.error()
                    if err is not None:
                        raise RuntimeError(str(err))
                    seen += 1
                    d = de(m.value(), in_ctx)
                    if d["amount"] > 100 and d["currency"] in ("CNY", "USD"):
                        d["amount_cny"] = float(d["amount"]) * 7.1
                        producer.produce(sink, ser(d, out_ctx), m.key(), m.partition())
                if batch:
                    if producer.flush(60):
                        msg = "the hand loop's outputs were not acknowledged within 60 s"
                        raise RuntimeError(msg)
                    consumer.commit(asynchronous=False)
        finally:
            consumer.close()


def check_outputs(bootstrap: str, url: str, sink: str, expect: int) -> None:
    """Read every output back with confluent-kafka's deserializer: each order once, converted."""
    with SchemaRegistryClient({"url": url}) as registry:
        de = AvroDeserializer(registry)
        ctx = SerializationContext(sink, MessageField.VALUE)
        consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"check-{sink}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
        })  # fmt: skip
        consumer.subscribe([sink])
        orders: set[int] = set()
        deadline = time.monotonic() + 120
        try:
            while len(orders) < expect and time.monotonic() < deadline:
                for m in consumer.consume(5000, 0.5):
                    if m.error() is None:
                        d = de(m.value(), ctx)
                        assert d["amount_cny"] == float(d["amount"]) * 7.1, d
                        orders.add(d["order"])
        finally:
            consumer.close()
    if len(orders) != expect:
        msg = f"{sink}: {len(orders)} distinct orders read back, {expect} expected"
        raise RuntimeError(msg)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    add_broker_arg(ap)
    args = ap.parse_args()
    n = args.events
    expect = expected_outputs(n)
    work = Path(tempfile.mkdtemp(prefix="eb-bench-avro-"))
    broker = start_broker(args.broker, work)
    redis = start_redis(data_dir=work / "redis")
    bootstrap = broker.bootstrap

    import ray

    from eventbus.schemas import kafka_registry_app
    from eventbus.serving import EventBusClient

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests/
    from tests.integration.registry_helpers import Served

    served = Served(kafka_registry_app(bootstrap, topic="_schemas"))
    url = served.url
    counter = iter(range(10_000))

    def topics() -> tuple[str, str]:
        k = next(counter)
        src, sink = f"avro-in-{k}", f"avro-out-{k}"
        asyncio.run(create_topics(bootstrap, [src, sink], partitions=PARTITIONS))
        return src, sink

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        namespace="eventbus",
        logging_level="ERROR",
        log_to_driver=False,
    )
    client = EventBusClient(None, bootstrap, redis.address)
    stats_redis = redis_lib.Redis.from_url(redis.address)
    base_rates, eb_rates = [], []
    try:
        for rnd in range(-args.warmup, args.rounds):
            src, sink = topics()
            produce_avro(bootstrap, url, src, n)
            baseline(bootstrap, url, src, sink, n)
            _, span = asyncio.run(sink_span(bootstrap, sink, expect))
            if rnd == 0:
                check_outputs(bootstrap, url, sink, expect)
            if rnd >= 0:
                base_rates.append(n / span)

            src, sink = topics()
            produce_avro(bootstrap, url, src, n)
            name = f"avro{rnd % 1000}"
            path = work / f"{name}.yaml"
            schema = json.dumps(json.dumps(PAYMENT_CNY))
            path.write_text(PIPELINE.format(name=name, src=src, sink=sink, url=url, schema=schema))
            client.deploy(path)
            wait_committed(stats_redis, name, n)
            _, span = asyncio.run(sink_span(bootstrap, sink, expect))
            if rnd == 0:
                check_outputs(bootstrap, url, sink, expect)
            client.delete(name)
            if rnd < 0:
                print("warm-up round done", flush=True)
                continue
            eb_rates.append(n / span)
            print(
                f"round {rnd}: hand loop {base_rates[-1]:,.0f} rec/s, "
                f"eventbus {eb_rates[-1]:,.0f} rec/s",
                flush=True,
            )
    finally:
        ray.shutdown()
        served.stop()
        broker.stop()
        redis.stop()
    ratio = statistics.median(eb_rates) / statistics.median(base_rates)
    print(
        json.dumps({
            "benchmark": "avro_pipeline",
            "broker": args.broker,
            "events": n,
            "rounds": args.rounds,
            "warmup_rounds": args.warmup,
            "outputs_per_round": expect,
            "baseline": "confluent-kafka Consumer/Producer + AvroDeserializer/AvroSerializer",
            "baseline_records_per_s": round(statistics.median(base_rates)),
            "eventbus_records_per_s": round(statistics.median(eb_rates)),
            "ratio": round(ratio, 3),
            "target_ratio": 0.9,
            "all_rates": {
                "baseline": [round(r) for r in base_rates],
                "eventbus": [round(r) for r in eb_rates],
            },
        })
    )  # fmt: skip


if __name__ == "__main__":
    main()
