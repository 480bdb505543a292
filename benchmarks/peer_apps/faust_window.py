"""The tumbling count per key in Faust (faust-streaming): a windowed table, as its
documentation writes one — ``app.Table(..., default=int, on_window_close=...)
.tumbling(1.0, expires=1.0).relative_to_stream()``, the agent adding one per event, and the
close callback sending ``{"key", "start", "n"}`` to the sink topic.

Faust closes a window from a timer (``table_cleanup_interval``, here 0.5 s) once its end is
``expires`` before the *wall clock* (``Table._del_old_keys``: ``window.stale(ts, time.time())``),
not before the stream's latest timestamp. Run by ``benchmarks/peers.py --scenario
tumbling_count`` with ``.venv-bench/faust/bin/python``: ``faust_window.py BOOTSTRAP SOURCE SINK GROUP``.
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
    broker_session_timeout=6.0,
    producer_linger=0.005,
    topic_partitions=1,
    table_cleanup_interval=0.5,
    web_enabled=False,
)
payments = app.topic(src, value_serializer="json")
counts_out = app.topic(sink, value_serializer="json")


async def window_closed(key, n):  # type: ignore[no-untyped-def]
    k, (start, _end) = key
    name = k.decode() if isinstance(k, bytes) else k
    await counts_out.send(key=name, value={"key": name, "start": round(start * 1000), "n": n})


counts = (
    app.Table("counts", default=int, on_window_close=window_closed)
    .tumbling(1.0, expires=1.0)
    .relative_to_stream()
)


@app.agent(payments)
async def count(stream):  # type: ignore[no-untyped-def]
    async for event in stream.events():
        counts[event.key] += 1


if __name__ == "__main__":
    sys.argv[1:] = ["worker", "--loglevel", "warn", "--without-web"]
    app.main()
