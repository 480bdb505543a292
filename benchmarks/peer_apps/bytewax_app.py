"""The peer pipeline in Bytewax with its Kafka connector (KafkaSource → filter → map → KafkaSink).

Run by ``benchmarks/peers.py`` as ``.venv-bench/bytewax/bin/python -m bytewax.run
bytewax_app:flow`` with ``PEER_BOOTSTRAP``, ``PEER_SOURCE`` and ``PEER_SINK`` in the
environment (Bytewax builds the dataflow at import).
"""

from __future__ import annotations

import json
import os

from bytewax import operators as op
from bytewax.connectors.kafka import KafkaSinkMessage
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow

brokers = [os.environ["PEER_BOOTSTRAP"]]
flow = Dataflow("payments")
kinp = kop.input("kafka-in", flow, brokers=brokers, topics=[os.environ["PEER_SOURCE"]])
op.inspect("errors", kinp.errs).then(op.raises, "crash-on-err")


def decode(msg):  # type: ignore[no-untyped-def]
    return msg, json.loads(msg.value)


def is_large(item):  # type: ignore[no-untyped-def]
    msg, payment = item
    return (
        dict(msg.headers).get("ce_type") == b"payment.created"
        and payment["amount"] > 100
        and payment["currency"] in ("CNY", "USD")
    )


def convert(item):  # type: ignore[no-untyped-def]
    msg, payment = item
    payment["amount_cny"] = payment["amount"] * 7.1
    headers = [(k, b"payment.large" if k == "ce_type" else v) for k, v in msg.headers]
    return KafkaSinkMessage(msg.key, json.dumps(payment).encode(), headers=headers)


decoded = op.map("decode", kinp.oks, decode)
large = op.filter("only_large", decoded, is_large)
out = op.map("to_cny", large, convert)
kop.output("kafka-out", out, brokers=brokers, topic=os.environ["PEER_SINK"])
