"""The tumbling count per key in Quix Streams, as its documentation writes a window.

``tumbling_window(duration_ms=1000).count().final(closing_strategy="partition")``: a count per
message key in one-second windows of the Kafka timestamp (event time), each window written to
the sink topic (``{"start", "end", "value"}``, keyed by the key) when the partition's watermark
passes its end. Run by ``benchmarks/peers.py --scenario tumbling_count`` with
``.venv-bench/quixstreams/bin/python``: ``quixstreams_window.py BOOTSTRAP SOURCE SINK GROUP``.
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta

from quixstreams import Application


def main(bootstrap: str, src: str, sink: str, group: str) -> None:
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        consumer_extra_config={"session.timeout.ms": 6000},
        loglevel=logging.WARNING,
    )
    payments = app.topic(src, value_deserializer="json")
    # Tansu's DescribeConfigs leaves out retention.*, which Quix copies to its changelog
    # topics' config: give them Kafka's defaults (keep forever)
    config = payments.broker_config
    for name in ("retention.ms", "retention.bytes"):
        config.extra_config.setdefault(name, "-1")
    payments.broker_config = config
    counts = app.topic(sink, value_serializer="json")

    sdf = app.dataframe(payments)
    # "partition": a window closes when the partition's latest timestamp passes its end, as
    # the other systems' watermarks do (the default, "key", waits for that key's next event)
    sdf = sdf.tumbling_window(timedelta(seconds=1)).count().final(closing_strategy="partition")
    sdf.to_topic(counts)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:5])
