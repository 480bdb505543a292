"""Aggregate: a tumbling count + sum per key, EventBus against Quix Streams' tumbling window
aggregation and against a plain asyncio redis-py loop doing the same per batch.

All three read the same pre-produced topic on the real Tansu broker (one partition, so one
watermark orders every window for each system; keys ``k0..k999``, event times in order over
``--windows`` one-second windows, the Kafka timestamp = the event's ``time``), and write one
JSON record per (key, window) when the window closes. A last event far ahead closes every
window. Outputs are checked against the answer computed here (every (key, window) once, the
right count and sum).

* baseline: one asyncio process: ``getmany(2000)`` → per batch each (key, window)'s count and
  sum folded in Python, one pipelined round trip of ``HINCRBY``/``HINCRBYFLOAT`` into Redis,
  then the windows the batch's watermark closed read (``HGETALL``) and deleted, produced
  (``send_batch``), committed;
* EventBus: the ``aggregate`` step on a Serve replica (one Lua call per batch, a timer
  closing windows), without and with ``delivery.dedupe`` (exactly once); ``idle_timeout_s:
  60``, as Quix has no wall-clock watermark (on a loaded machine a replica may stall longer
  than the default 5 s, and the clock would close windows of the backlog early);
* Quix Streams: ``tumbling_window(...).agg(Count(), Sum()).final(closing_strategy="partition")``
  (RocksDB state, changelog topics), run by ``--quix-python`` (default
  ``.venv-bench/quixstreams/bin/python``, made by ``make bench-peers``) as a subprocess.

Throughput: the events processed between the first and the last output (all but the first
window's) divided by the time between their arrivals at a reader started before the system
under test (Quix stamps its outputs with the window's time, so broker timestamps would not
time the three alike); median of rounds. Last
line: one JSON object with the figures, ``ratio_vs_quix`` and ``ratio_vs_baseline``
(EventBus / other, events/s).

``--profile DIR``: instead of measuring, run EventBus once without and once with dedupe and
py-spy its replica meanwhile (``benchmarks/_profile.py``); the top frames go to
``DIR/eventbus*.md`` and stdout. ``--idle``: every thread's wall time instead (where each
thread waits), frames under their thread's name.

Run: ``.venv/bin/python benchmarks/aggregate.py [--events 200000] [--rounds 3] [--profile DIR [--idle]]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import orjson  # noqa: E402
from _profile import finish, record, render  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402

from eventbus._internal.redis_service import start_redis  # noqa: E402
from eventbus._internal.services import create_topics, start_tansu  # noqa: E402

KEYS = 1000
WINDOW_MS = 1000
T0 = 1_700_000_000_000


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def make_events(n: int, windows: int) -> list[tuple[str, int, int]]:
    """(key, event time ms, amount), in time order; then one event far ahead."""
    out = [(f"k{(i * 7919) % KEYS}", T0 + i * windows * WINDOW_MS // n, i % 100) for i in range(n)]
    out.append(("~end", T0 + (windows + 100) * WINDOW_MS, 0))
    return out


def answer(evs: list[tuple[str, int, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    got: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for k, t, amount in evs[:-1]:
        w = got[(k, t - t % WINDOW_MS)]
        w[0] += 1
        w[1] += amount
    return {k: (c, s) for k, (c, s) in got.items()}


async def produce(bootstrap: str, topic: str, evs: list[tuple[str, int, int]]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=512 * 1024
    )
    await producer.start()
    try:
        batch, futs = producer.create_batch(), []
        for i, (k, t, amount) in enumerate(evs):
            headers = [
                ("ce_specversion", b"1.0"),
                ("ce_id", f"e{i}".encode()),
                ("ce_source", b"/bench"),
                ("ce_type", b"metric"),
                ("ce_time", iso(t).encode()),
                ("content-type", b"application/json"),
            ]
            value = orjson.dumps({"k": k, "amount": amount})
            args = {"key": k.encode(), "value": value, "timestamp": t, "headers": headers}
            if batch.append(**args) is None:
                futs.append(await producer.send_batch(batch, topic, partition=0))
                batch = producer.create_batch()
                batch.append(**args)
        futs.append(await producer.send_batch(batch, topic, partition=0))
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


class Outputs:
    """Reads an output topic from the start on its own thread, from before the system under
    test starts, and notes each record's arrival time here: Quix stamps its outputs with the
    window's time, so broker timestamps cannot time all three alike.

    Args:
        bootstrap: the broker.
        topic: the output topic.
        expect: how many outputs to wait for.
    """

    def __init__(self, bootstrap: str, topic: str, expect: int) -> None:
        self.bootstrap, self.topic, self.expect = bootstrap, topic, expect
        self.values: list[dict[str, Any]] = []
        self.first = self.last = 0.0
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        self._ready.wait(60)

    def _main(self) -> None:
        try:
            asyncio.run(self._read())
        except BaseException as e:  # noqa: BLE001 - reported by wait()
            self.error = e
            self._ready.set()

    async def _read(self, timeout_s: float = 300) -> None:
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=20,
        )
        await consumer.start()
        deadline = time.monotonic() + timeout_s
        try:
            await consumer.getmany(timeout_ms=100)  # assigned and fetching
            self._ready.set()
            while len(self.values) < self.expect and time.monotonic() < deadline:
                got = await consumer.getmany(timeout_ms=200, max_records=10000)
                now = time.monotonic()
                for records in got.values():
                    if not self.first:
                        self.first = now
                    self.last = now
                    for r in records:
                        value = orjson.loads(r.value)
                        value.setdefault("key", r.key.decode() if r.key else None)
                        if value["key"] != "~end":  # its window closes once the input is idle
                            self.values.append(value)
        finally:
            await consumer.stop()

    def wait(self) -> tuple[list[dict[str, Any]], float]:
        """The outputs and the seconds between the first and the last arrival.

        Raises:
            RuntimeError: fewer than ``expect`` outputs came within the time limit.
        """
        self._thread.join()
        if self.error is not None:
            raise self.error
        if len(self.values) < self.expect:
            msg = f"only {len(self.values)} of {self.expect} outputs arrived on {self.topic}"
            raise RuntimeError(msg)
        return self.values, max(self.last - self.first, 1e-3)


def check(
    label: str, outputs: list[dict[str, Any]], expect: dict[tuple[str, int], tuple[int, int]]
) -> None:
    got = {}
    for o in outputs:
        start = o["window_start"] if "window_start" in o else o["start"]
        if isinstance(start, str):
            start = int(datetime.fromisoformat(start.replace("Z", "+00:00")).timestamp() * 1000)
        got[(o.get("key", o.get("k")), start)] = (o["n"], int(o["total"]))
    if got != expect:
        wrong = [(k, got.get(k), v) for k, v in expect.items() if got.get(k) != v]
        extra = sorted(got.keys() - expect.keys())
        msg = f"{label}: {len(wrong)} windows wrong or missing, e.g. {wrong[:3]}; {len(extra)} not expected, e.g. {extra[:3]}"
        raise AssertionError(msg)


def baseline_fold(records: Any, parts: dict[tuple[int, str], list[int]], wm: int) -> int:
    """The plain loop's pre-aggregation of records (``.headers``, ``.value``) per (window, key)
    into ``parts``; returns the watermark (the latest event time seen)."""
    for rec in records:
        text = dict(rec.headers)["ce_time"].decode().replace("Z", "+00:00")
        t = int(datetime.fromisoformat(text).timestamp() * 1000)
        data = orjson.loads(rec.value)
        p = parts[(t - t % WINDOW_MS, data["k"])]
        p[0] += 1
        p[1] += data["amount"]
        wm = max(wm, t)
    return wm


def baseline_queue(
    pipe: Any, parts: dict[tuple[int, str], list[int]], prefix: str, open_windows: set[int], wm: int
) -> list[int]:
    """Queue the plain loop's Redis work for one batch on ``pipe`` (sync or asyncio): HINCRBY
    and HINCRBYFLOAT per (window, key), then HGETALL + DEL of each window the watermark closed
    (returned, in order)."""
    for (start, k), (n, total) in parts.items():
        pipe.hincrby(f"{prefix}{start}", f"{k}:n", n)
        pipe.hincrbyfloat(f"{prefix}{start}", f"{k}:s", total)
        open_windows.add(start)
    closed = sorted(w for w in open_windows if w + WINDOW_MS <= wm)
    for w in closed:
        pipe.hgetall(f"{prefix}{w}")
        pipe.delete(f"{prefix}{w}")
    return closed


def baseline_closed(
    closed: list[int], hashes: list[Any], open_windows: set[int]
) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(key, window start, {"n", "s"}) for each key of the closed windows' hashes."""
    for w, fields in zip(closed, hashes):
        open_windows.discard(w)
        per_key: dict[str, dict[str, Any]] = defaultdict(dict)
        for f, v in fields.items():
            k, _, what = f.decode().rpartition(":")
            per_key[k][what] = v
        for k, v in per_key.items():
            yield k, w, v


async def baseline(bootstrap: str, redis_url: str, topic: str, sink: str, expect: int) -> None:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url)
    prefix = f"bench:agg:{uuid.uuid4().hex[:6]}:"
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"baseline-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=2000,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_wait_ms=10,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=0, max_batch_size=512 * 1024
    )
    await consumer.start()
    await producer.start()
    emitted, wm, open_windows = 0, 0, set()
    try:
        while emitted < expect:
            batch = await consumer.getmany(timeout_ms=100, max_records=2000)
            if not batch:
                continue
            parts: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
            for records in batch.values():
                wm = baseline_fold(records, parts, wm)
            pipe = r.pipeline(transaction=False)
            closed = baseline_queue(pipe, parts, prefix, open_windows, wm)
            results = await pipe.execute()
            out, futs = producer.create_batch(), []
            for k, w, v in baseline_closed(closed, results[2 * len(parts) :: 2], open_windows):
                value = orjson.dumps(
                    {"key": k, "start": w, "n": int(v["n"]), "total": float(v["s"])}
                )
                if out.append(key=k.encode(), value=value, timestamp=None, headers=[]) is None:
                    futs.append(await producer.send_batch(out, sink, partition=0))
                    out = producer.create_batch()
                    out.append(key=k.encode(), value=value, timestamp=None, headers=[])
                emitted += 1
            if out.record_count():
                futs.append(await producer.send_batch(out, sink, partition=0))
            await asyncio.gather(*futs)
            await consumer.commit({tp: recs[-1].offset + 1 for tp, recs in batch.items()})
    finally:
        await consumer.stop()
        await producer.stop()
        await r.aclose()


PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources: [{{kafka: {{topic: {topic}}}}}]
  steps:
    - id: per_key
      aggregate:
        key: data.k
        window: {{tumbling: {{size_s: {size_s}}}}}
        aggregations: {{n: count, total: {{sum: data.amount}}}}
        idle_timeout_s: 60
  sink: {{kafka: {{topic: {sink}}}}}
{delivery}  serving: {{replicas: 1, batch: {{max_size: 2000}}}}
"""


EVENTBUS_RUNS = (("eventbus", ""), ("eventbus_dedupe", "  delivery: {dedupe: {window_s: 600}}\n"))


def replicas(pipeline: str) -> list[int]:
    """This benchmark's Serve replica processes of ``pipeline`` (other Ray clusters on the
    machine may run replicas of the same name: descendants only)."""
    import psutil

    prefix = f"ray::ServeReplica:eventbus-{pipeline}:"
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if (p.cmdline() or [""])[0].startswith(prefix):
                found.append(p.pid)
        except psutil.Error:  # exited meanwhile
            continue
    if not found:
        msg = f"no replica process {prefix}* among this benchmark's processes"
        raise RuntimeError(msg)
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--windows", type=int, default=10, help="one-second windows of event time")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--quix-python",
        default=str(ROOT / ".venv-bench" / "quixstreams" / "bin" / "python"),
        help="an interpreter with quixstreams installed (`make bench-peers` builds "
        ".venv-bench/quixstreams)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a folder: instead of measuring, py-spy EventBus's replica (its top frames go there)",
    )
    ap.add_argument(
        "--idle",
        action="store_true",
        help="with --profile: sample every thread, waiting or not (wall time per thread), "
        "instead of the GIL holder",
    )
    args = ap.parse_args()
    if args.idle and args.profile is None:
        ap.error("--idle samples the replica for --profile DIR: pass --profile DIR too")
    if args.profile is None and not Path(args.quix_python).exists():
        sys.exit(
            f"--quix-python {args.quix_python} does not exist: run `make bench-peers` (it builds "
            ".venv-bench/quixstreams) or pass an interpreter with quixstreams installed"
        )
    n, windows = args.events, args.windows
    evs = make_events(n, windows)
    expect = answer(evs)
    busy = n * (windows - 1) / windows  # events processed between the first and last output
    work = Path(tempfile.mkdtemp(prefix="eb-agg-bench-"))
    tansu = start_tansu(log_dir=work)
    redis = start_redis(data_dir=work / "redis")
    bootstrap = tansu.address
    counter = iter(range(10_000))

    def topics() -> tuple[str, str]:
        k = next(counter)
        names = (f"agg-in-{k}", f"agg-out-{k}")
        asyncio.run(create_topics(bootstrap, names, partitions=1))
        asyncio.run(produce(bootstrap, names[0], evs))
        return names

    import ray

    from eventbus.serving import EventBusClient

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        namespace="eventbus",
        logging_level="ERROR",
        log_to_driver=False,
    )
    client = EventBusClient(None, bootstrap, redis.address)
    rates: dict[str, list[float]] = {
        "baseline": [],
        "quix": [],
        "eventbus": [],
        "eventbus_dedupe": [],
    }

    def run_eventbus(
        label: str, delivery: str, spy: Path | None = None
    ) -> tuple[list[dict[str, Any]], float]:
        src, sink = topics()
        name = f"aggbench{next(counter)}"
        path = work / f"{name}.yaml"
        path.write_text(
            PIPELINE.format(
                name=name, topic=src, sink=sink, size_s=WINDOW_MS / 1000, delivery=delivery
            )
        )
        outputs = Outputs(bootstrap, sink, len(expect))
        client.deploy(path)
        spies = (
            [record(pid, spy / f"{label}-{pid}.raw", idle=args.idle) for pid in replicas(name)]
            if spy
            else []
        )
        try:
            return outputs.wait()
        finally:
            for p in spies:
                finish(p)
            client.delete(name)

    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        try:
            for label, delivery in EVENTBUS_RUNS:
                out, span = run_eventbus(label, delivery, args.profile)
                check(label, out, expect)
                text = "\n\n".join(
                    render(
                        f"{label}, process {raw.stem} ({busy / span:,.0f} events/s sampled)", raw
                    )
                    for raw in sorted(args.profile.glob(f"{label}-*.raw"))
                )
                (args.profile / f"{label}.md").write_text(text + "\n")
                print(text, flush=True)
        finally:
            ray.shutdown()
            tansu.stop()
            redis.stop()
        return
    try:
        for rnd in range(-1, args.rounds):  # round -1 warms Ray up, unmeasured
            src, sink = topics()
            outputs = Outputs(bootstrap, sink, len(expect))
            asyncio.run(baseline(bootstrap, redis.address, src, sink, len(expect)))
            out, span = outputs.wait()
            check("baseline", out, expect)
            if rnd >= 0:
                rates["baseline"].append(busy / span)
            src, sink = topics()
            outputs = Outputs(bootstrap, sink, len(expect))
            proc = subprocess.Popen(
                [
                    args.quix_python,
                    str(ROOT / "benchmarks" / "aggregate_quix.py"),
                    bootstrap,
                    src,
                    sink,
                    str(work / f"quix-{rnd}"),
                    str(WINDOW_MS),
                ],
                stdout=subprocess.DEVNULL,
                stderr=open(work / f"quix-{rnd}.log", "wb"),  # noqa: SIM115
            )
            try:
                out, span = outputs.wait()
            finally:
                proc.terminate()
                proc.wait(30)
            check("quix", out, expect)
            if rnd >= 0:
                rates["quix"].append(busy / span)
            for label, delivery in EVENTBUS_RUNS:
                out, span = run_eventbus(label, delivery)
                check(label, out, expect)
                if rnd >= 0:
                    rates[label].append(busy / span)
            if rnd >= 0:
                print(
                    f"round {rnd}: "
                    + ", ".join(f"{k} {v[-1]:,.0f} events/s" for k, v in rates.items()),
                    flush=True,
                )
    finally:
        ray.shutdown()
        tansu.stop()
        redis.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        json.dumps(
            {
                "benchmark": "aggregate",
                "events": n,
                "keys": KEYS,
                "windows": windows,
                "rounds": args.rounds,
                "baseline_events_per_s": round(med["baseline"]),
                "quix_events_per_s": round(med["quix"]),
                "eventbus_events_per_s": round(med["eventbus"]),
                "eventbus_dedupe_events_per_s": round(med["eventbus_dedupe"]),
                "ratio_vs_quix": round(med["eventbus"] / med["quix"], 3),
                "ratio_vs_baseline": round(med["eventbus"] / med["baseline"], 3),
                "ratio_dedupe_vs_quix": round(med["eventbus_dedupe"] / med["quix"], 3),
                "ratio_dedupe_vs_baseline": round(med["eventbus_dedupe"] / med["baseline"], 3),
                "all_rates": {k: [round(x) for x in v] for k, v in rates.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
