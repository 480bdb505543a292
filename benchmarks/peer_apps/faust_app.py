"""The peer pipeline in Faust (faust-streaming), an agent as its documentation writes one.

Run by ``benchmarks/peers.py`` with ``.venv-bench/faust/bin/python``:
``faust_app.py BOOTSTRAP SOURCE_TOPIC SINK_TOPIC GROUP`` (the group is the app id).
"""

from __future__ import annotations

import sys

import faust

bootstrap, src, sink, group = sys.argv[1:5]
app = faust.App(
    group,
    broker=f"kafka://{bootstrap}",
    value_serializer="json",
    consumer_auto_offset_reset="earliest",
    broker_session_timeout=6.0,  # the benchmark's one setting for every group member
    # librdkafka's default linger, which Quix Streams and Bytewax run with (Faust's own is 0:
    # one produce request per send())
    producer_linger=0.005,
    topic_partitions=3,
    web_enabled=False,
)
payments = app.topic(src, value_serializer="json")
large = app.topic(sink, value_serializer="json")


@app.agent(payments)
async def only_large(stream):  # type: ignore[no-untyped-def]
    async for event in stream.events():
        payment = event.value
        headers = event.headers
        if (
            headers.get("ce_type") == b"payment.created"
            and payment["amount"] > 100
            and payment["currency"] in ("CNY", "USD")
        ):
            payment["amount_cny"] = payment["amount"] * 7.1
            await large.send(
                key=event.key,
                value=payment,
                headers={**headers, "ce_type": b"payment.large"},
            )


if __name__ == "__main__":
    sys.argv[1:] = ["worker", "--loglevel", "warn", "--without-web"]
    app.main()
