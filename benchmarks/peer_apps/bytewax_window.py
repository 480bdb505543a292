"""The tumbling count per key in Bytewax: ``count_window`` with an ``EventClock`` on the Kafka
timestamp and a one-second ``TumblingWindower``, as its windowing documentation shows.

Each closed window goes to the sink topic as ``{"key", "start", "n"}`` (the window's start from
its id: ``align_to + id * length``). Run by ``benchmarks/peers.py --scenario tumbling_count``
as ``.venv-bench/bytewax/bin/python -m bytewax.run bytewax_window:flow`` with
``PEER_BOOTSTRAP``, ``PEER_SOURCE``, ``PEER_SINK``, ``PEER_ALIGN_MS`` (the first window's
start) and ``PEER_WAIT_S`` (the clock's ``wait_for_system_duration``) in the environment.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

from bytewax import operators as op
from bytewax.connectors.kafka import KafkaSinkMessage
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow
from bytewax.operators.windowing import EventClock, TumblingWindower, count_window

brokers = [os.environ["PEER_BOOTSTRAP"]]
align_ms = int(os.environ["PEER_ALIGN_MS"])
LENGTH = timedelta(seconds=1)

flow = Dataflow("counts")
kinp = kop.input("kafka-in", flow, brokers=brokers, topics=[os.environ["PEER_SOURCE"]])
op.inspect("errors", kinp.errs).then(op.raises, "crash-on-err")


def event_time(msg):  # type: ignore[no-untyped-def]
    _, ms = msg.timestamp  # (timestamp type, ms): the producer's CreateTime
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


# the watermark: the latest event time - the wait + the system time since that event; a wait
# of 0 closes a window early whenever the process stalls for a window's length (PEER_WAIT_S)
wait = timedelta(seconds=float(os.environ["PEER_WAIT_S"]))
clock = EventClock(event_time, wait_for_system_duration=wait)
windower = TumblingWindower(length=LENGTH, align_to=datetime.fromtimestamp(align_ms / 1000, UTC))
counted = count_window("count", kinp.oks, clock, windower, lambda msg: msg.key.decode())


def to_record(item):  # type: ignore[no-untyped-def]
    key, (window_id, n) = item
    start = align_ms + window_id * int(LENGTH.total_seconds() * 1000)
    return KafkaSinkMessage(key.encode(), json.dumps({"key": key, "start": start, "n": n}).encode())


out = op.map("to_record", counted.down, to_record)
kop.output("kafka-out", out, brokers=brokers, topic=os.environ["PEER_SINK"])
