"""The hand-written librdkafka loop (confluent-kafka): the aiokafka baseline's loop, in C's client.

poll → consume(1999, timeout=0) → decode → filter/convert → produce → flush (await acks) →
commit, one process.
Run by ``benchmarks/peers.py`` with ``.venv-bench/confluent/bin/python``:
``confluent_loop.py BOOTSTRAP SOURCE_TOPIC SINK_TOPIC GROUP``; stops on SIGTERM.
"""

from __future__ import annotations

import signal
import sys

import orjson
from confluent_kafka import Consumer, Producer


def main(bootstrap: str, src: str, sink: str, group: str) -> None:
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "fetch.wait.max.ms": 10,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})
    consumer.subscribe([src])
    try:
        while running[0]:
            # the first record as soon as one is there, then what else is fetched already:
            # consume(2000, timeout) alone waits the whole timeout for 2,000 records, which
            # held every event up to 100 ms at low rates
            first = consumer.poll(0.1)
            if first is None:
                continue
            msgs = [first, *consumer.consume(1999, timeout=0)]
            for m in msgs:
                if m.error():
                    continue
                headers = dict(m.headers() or ())
                data = orjson.loads(m.value())
                if (
                    headers.get("ce_type") == b"payment.created"
                    and data["amount"] > 100
                    and data["currency"] in ("CNY", "USD")
                ):
                    data["amount_cny"] = data["amount"] * 7.1
                    headers["ce_type"] = b"payment.large"
                    producer.produce(
                        sink,
                        orjson.dumps(data),
                        m.key(),
                        partition=m.partition(),
                        headers=list(headers.items()),
                    )
            producer.flush()
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()


if __name__ == "__main__":
    main(*sys.argv[1:5])
