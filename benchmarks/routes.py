"""Routing overhead: a Kafka source's delivery of outputs to two named sinks through routes
(a CEL ``when`` and a default route, fan-out to both for half the events) against the same
events to one sink without routes (the baseline), same run, in process.

What is timed is ``Delivery.send`` per batch (routing plan, per-sink shares, concurrent sends,
turns at the ordered sink) with sinks that take events at no cost, so the figure is
EventBus's own cost per event, not a broker's. Events per second are (event, sink) deliveries
divided by the time; the ratio is routed / baseline events/s of *input* events.

Last line: one JSON object with both figures and the ratio.

Run: ``.venv/bin/python benchmarks/routes.py [--batches 200] [--batch 2000] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from eventbus.eventing._routing import Route, Routing
from eventbus.eventing.sinks import Sink
from eventbus.eventing.sources import DeliveryPolicy, KafkaSourceConfig, SourceSinks
from eventbus.eventing.sources._kafka_batch import BatchMaker, KafkaBatch
from eventbus.eventing.sources._kafka_delivery import Delivery
from eventbus.pipelines._routes import route_predicate

TP = TopicPartition("in", 0)


class NullSink(Sink):
    """Takes every event at once (counts them)."""

    def __init__(self) -> None:
        self.count = 0

    async def send(self, items: Any) -> None:
        self.count += len(items)


def batches(n: int, size: int) -> list[KafkaBatch]:
    config = KafkaSourceConfig(topic="in")
    maker = BatchMaker(config, False, lambda r, e: (None, None))  # type: ignore[arg-type, return-value]
    out = []
    for b in range(n):
        records = [
            ConsumerRecord(
                "in",
                0,
                o,
                0,
                0,
                f"k{o % 100}".encode(),
                orjson.dumps({"amount": o % 2000}),
                None,
                0,
                0,
                [
                    ("ce_specversion", b"1.0"),
                    ("ce_source", b"/b"),
                    ("ce_type", b"order" if o % 2 else b"note"),
                    ("ce_id", f"e{o}".encode()),
                ],
            )
            for o in range(b * size, (b + 1) * size)
        ]
        batch = maker.make({TP: records})
        assert batch is not None
        out.append(batch)
    return out


async def run(data: list[KafkaBatch], routed: bool) -> tuple[float, int]:
    stats = dict.fromkeys(
        (
            "decode_errors",
            "outputs",
            "dropped",
            "failed",
            "dead_lettered",
            "duplicates",
            "too_large",
            "unrouted",
        ),
        0,
    )
    a, b = NullSink(), NullSink()
    routing = None
    if routed:
        routing = Routing(
            {"a": a, "b": b},
            [
                Route(
                    "routes[0]", ("a", "b"), when=route_predicate("type == 'order'"), ordered=True
                ),
                Route("routes[1]", ("b",)),
            ],
        )
    sinks = SourceSinks(a, None, routing)
    delivery = Delivery(KafkaSourceConfig(topic="in"), "bench", sinks, DeliveryPolicy(), stats)
    started = time.perf_counter()
    for batch in data:
        turn = delivery.reserve()
        items = [(i, [e], 1) for i, e in enumerate(batch.events)]
        await delivery.send(batch, items, [], turn)  # type: ignore[arg-type]
        turn.release()
    return time.perf_counter() - started, a.count + b.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    data = batches(args.batches, args.batch)
    n = args.batches * args.batch
    single: list[float] = []
    routed: list[float] = []
    deliveries = 0
    for _ in range(args.repeats):  # interleaved: the machine's noise hits both alike
        t, _count = asyncio.run(run(data, routed=False))
        single.append(n / t)
        t, deliveries = asyncio.run(run(data, routed=True))
        routed.append(n / t)
    s, r = statistics.median(single), statistics.median(routed)
    print(
        f"single sink: {s:,.0f} events/s; routed to two sinks: {r:,.0f} events/s "
        f"({deliveries / n:.2f} deliveries per event); ratio {r / s:.2f}"
    )
    print(
        json.dumps(
            {
                "events": n,
                "single_sink_events_per_s": round(s),
                "routed_events_per_s": round(r),
                "routed_deliveries_per_event": round(deliveries / n, 2),
                "ratio": round(r / s, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
