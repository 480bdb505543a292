"""The peer pipeline in Quix Streams, as its documentation writes a StreamingDataFrame.

Run by ``benchmarks/peers.py`` with ``.venv-bench/quixstreams/bin/python``:
``quixstreams_app.py BOOTSTRAP SOURCE_TOPIC SINK_TOPIC GROUP``.
"""

from __future__ import annotations

import sys

from quixstreams import Application


def main(bootstrap: str, src: str, sink: str, group: str) -> None:
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        # the benchmark's one setting for every group member: the broker holds a join for
        # half the session timeout, which would only lengthen each start
        consumer_extra_config={"session.timeout.ms": 6000},
    )
    payments = app.topic(src, value_deserializer="json")
    large = app.topic(sink, value_serializer="json")

    sdf = app.dataframe(payments)
    sdf = sdf.filter(
        lambda value, key, timestamp, headers: (
            dict(headers or ()).get("ce_type") == b"payment.created"
        ),
        metadata=True,
    )
    sdf = sdf.filter(lambda payment: payment["amount"] > 100)
    sdf = sdf.filter(lambda payment: payment["currency"] in ("CNY", "USD"))
    sdf = sdf.apply(lambda payment: {**payment, "amount_cny": payment["amount"] * 7.1})
    sdf = sdf.set_headers(
        lambda value, key, timestamp, headers: [
            (k, b"payment.large" if k == "ce_type" else v) for k, v in headers or ()
        ]
    )
    sdf.to_topic(large)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:5])
