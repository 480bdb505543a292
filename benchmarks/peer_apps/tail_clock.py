"""The sink's wall clock for ``benchmarks/peers.py``: when the first and the last output arrive.

A librdkafka consumer (no group: it assigns the sink's partitions from the beginning) counts
records as they arrive and prints one JSON line ``{"first": t, "last": t, "count": n}`` (times
from ``time.time()``) once ``expect`` records are in, or ``timeout_s`` after the first. It prints ``ready``
first, once it fetches. confluent-kafka's fetches run in C threads and only the count crosses
into Python, so the clock takes little CPU from the system it times. (The broker's end offsets
cannot stand in: Tansu reports the last batch's base offset.)

Run with ``.venv-bench/confluent/bin/python``: ``tail_clock.py BOOTSTRAP TOPIC PARTITIONS EXPECT TIMEOUT_S``.
"""

from __future__ import annotations

import json
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

START_TIMEOUT_S = 120.0  # the system's start (Ray deploy, group join) until its first output


def main(bootstrap: str, topic: str, partitions: int, expect: int, timeout_s: float) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tail-clock",  # required by librdkafka; never joined (assign, no commit)
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    consumer.consume(1, timeout=0.1)
    print("ready", flush=True)
    first = last = None
    count = 0
    deadline = time.monotonic() + START_TIMEOUT_S
    while count < expect and time.monotonic() < deadline:
        msgs = consumer.consume(10000, timeout=0.05)
        if msgs:
            now = time.time()
            count += sum(1 for m in msgs if m.error() is None)
            if first is None:
                first, deadline = now, time.monotonic() + timeout_s
            last = now
    consumer.close()
    print(json.dumps({"first": first, "last": last, "count": count}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
