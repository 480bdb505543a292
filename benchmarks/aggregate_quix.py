"""The Quix Streams side of ``benchmarks/aggregate.py``, run by the benchmark venv's
interpreter as a subprocess (quixstreams is not a dependency of EventBus).

A tumbling window per message key (1 s by default) with a count and a sum of ``amount``,
closed per partition (``closing_strategy="partition"``: the same watermark as EventBus's
aggregate, one per step) and written to the output topic as JSON.

Run: ``PYTHON benchmarks/aggregate_quix.py BOOTSTRAP IN_TOPIC OUT_TOPIC STATE_DIR [WINDOW_MS]``
"""

from __future__ import annotations

import logging
import sys

from quixstreams import Application
from quixstreams.dataframe.windows import Count, Sum


def main() -> None:
    bootstrap, in_topic, out_topic, state_dir = sys.argv[1:5]
    window_ms = int(sys.argv[5]) if len(sys.argv) > 5 else 1000
    app = Application(
        broker_address=bootstrap,
        consumer_group=f"quix-{in_topic}",
        auto_offset_reset="earliest",
        state_dir=state_dir,
        loglevel=logging.WARNING,
    )
    source = app.topic(in_topic, value_deserializer="json", key_deserializer="str")
    # Tansu's DescribeConfigs leaves out retention.*, which Quix copies to its changelog
    # topics' config: give them Kafka's defaults (keep forever).
    config = source.broker_config
    for name in ("retention.ms", "retention.bytes"):
        config.extra_config.setdefault(name, "-1")
    source.broker_config = config
    sink = app.topic(out_topic, value_serializer="json", key_serializer="str")
    sdf = app.dataframe(source)
    sdf = (
        sdf.tumbling_window(duration_ms=window_ms)
        .agg(n=Count(), total=Sum("amount"))
        .final(closing_strategy="partition")
    )
    sdf.to_topic(sink)
    app.run()


if __name__ == "__main__":
    main()
