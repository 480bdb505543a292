"""The exactly-once tests' harness (``test_exactly_once``): :class:`Driver` runs an
``eos_driver`` process (a replica's Kafka path), :func:`produce` writes the numbered, keyed
input events, and :func:`checked` reads the outputs and dead letters ``read_committed`` and
checks that each expected one is there exactly once, in per-key order."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from eventbus import CloudEvent
from eventbus.eventing._codecs import decode_kafka, encode_kafka_binary
from tests.integration.test_faults import check_exactly_once_in_key_order

KEYS = 40
#: The event time (ms) of event 0: a whole minute, in the past (never ahead of the clock).
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000
ROOT = Path(__file__).resolve().parents[2]


class Driver:
    """One ``eos_driver`` process; its last counters are kept from its stdout."""

    def __init__(
        self,
        bootstrap: str,
        topics: tuple[str, str, str],
        group: str,
        delay_s: float,
        interval_ms: int = 100,
        kill_at: str = "1:0",
        extra_env: dict[str, str] | None = None,
    ):
        # kill_at: WAITING:COMMITS[:open], where SIGUSR2 makes the driver kill itself (eos_driver);
        # extra_env: e.g. EOS_JOIN (eos_driver's join pipeline)
        env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}", EOS_KILL_AT=kill_at)
        env.update(extra_env or {})
        # EOS_LOG=FILE: the drivers' logs go there too (debugging); each driver's own log is
        # kept so that a failed check shows what the drivers warned of
        self.log_path = Path(tempfile.mkstemp(prefix="eos-driver-", suffix=".log")[1])
        self._log = open(env.get("EOS_LOG", self.log_path), "a")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.eos_driver",
                bootstrap,
                *topics,
                group,
                str(delay_s),
                str(interval_ms),
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            cwd=ROOT,
            text=True,
        )
        self.ready = threading.Event()
        self.stats: dict[str, int] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ready"):
                self.ready.set()
            elif line.startswith("{"):
                self.stats = json.loads(line)

    def wait_ready(self, timeout_s: float = 60) -> None:
        assert self.ready.wait(timeout_s), "the driver did not join its group"

    def wait_dead(self, timeout_s: float) -> int | None:
        """The process's return code once it ended, or None after ``timeout_s``."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)  # the pipe ended with the process
        self._log.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def warnings_of(drivers: list[Driver]) -> str:
    """What the drivers logged at WARNING or above (shown when a check fails)."""
    lines = []
    for d in drivers:
        if d.log_path.exists():
            text = d.log_path.read_text(errors="replace")
            lines += [ln for ln in text.splitlines() if " WARNING " in ln or " ERROR " in ln]
    return "\n".join(lines[-60:])


async def checked(drivers: list[Driver], *args: Any) -> list[CloudEvent]:
    """:func:`check`, with the drivers' warnings added to a failure's message."""
    try:
        return await check(*args)
    except AssertionError as e:
        stats = "\n".join(json.dumps(d.stats) for d in drivers)
        msg = f"{e}\n-- the drivers' counters:\n{stats}\n-- their warnings:\n{warnings_of(drivers)}"
        raise AssertionError(msg) from e


def event(i: int, seq: Counter[str]) -> tuple[str, CloudEvent]:
    """Event ``i``: keyed ``k<i % KEYS>``, its event time ``i`` ms after :data:`T0` (the
    join pipeline's windows are of event time)."""
    key = f"k{i % KEYS}"
    seq[key] += 1
    data: dict[str, Any] = {"n": i, "key": key, "seq": seq[key]}
    if i % 50 == 0:
        data["boom"] = True  # fails the convert: a dead letter
    at = datetime.fromtimestamp((T0 + i) / 1000, tz=UTC)
    return key, CloudEvent.create(type="e.test", source="/eos", id=f"e{i}", time=at, data=data)


async def produce(
    bootstrap: str,
    topic: str,
    n: int,
    seconds: float,
    done: list[int],
    until: asyncio.Event | None = None,
    cap: list[int] | None = None,
) -> None:
    """Events 0.. in chunks of 500, ``n`` in ``seconds``; ``done[0]``: how many are written.
    With ``until``, stop at the first chunk boundary after it is set (``n``: the most); with
    ``cap``, hold at a chunk boundary while ``cap[0]`` events are written (the time held is
    not counted in the pace)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)
    await producer.start()
    seq: Counter[str] = Counter()
    start = time.monotonic()
    try:
        for base in range(0, n, 500):
            if until is not None and until.is_set():
                break
            if cap is not None and base >= cap[0]:
                held = time.monotonic()
                while base >= cap[0]:
                    await asyncio.sleep(0.05)  # waiting for the test to raise the cap
                start += time.monotonic() - held
            futs = []
            for i in range(base, min(n, base + 500)):
                key, e = event(i, seq)
                headers, value = encode_kafka_binary(e)
                futs.append(await producer.send(topic, value, key=key.encode(), headers=headers))
            await asyncio.gather(*futs)
            done[0] = min(n, base + 500)
            due = start + seconds * done[0] / n
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())  # pacing the producer
    finally:
        await producer.stop()


async def read(bootstrap: str, topic: str, isolation: str, until: int, timeout_s: float) -> list:
    """Every record of ``topic`` as events, until ``until`` arrived (then 1 s more)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation,
    )
    await consumer.start()
    out: list[CloudEvent] = []
    deadline = time.monotonic() + timeout_s
    extra: float | None = None
    try:
        while time.monotonic() < deadline and (extra is None or time.monotonic() < extra):
            data = await consumer.getmany(timeout_ms=200, max_records=5000)
            for tp, records in data.items():
                out += [
                    decode_kafka(
                        r.value,
                        list(r.headers or ()),
                        key=r.key,
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=r.offset,
                        default_type="x",
                        default_source="x",
                    )
                    for r in records
                ]
            if extra is None and len(out) >= until:
                extra = time.monotonic() + 1.0
    finally:
        await consumer.stop()
    return out


def expected(n: int) -> tuple[set[str], set[str]]:
    outputs = {f"e{i}" for i in range(0, n, 2) if i % 50}
    dead = {f"e{i}" for i in range(0, n, 50)}
    return outputs, dead


async def check(bootstrap: str, sink: str, dlq: str, n: int) -> list[CloudEvent]:
    want_out, want_dead = expected(n)
    out = await read(bootstrap, sink, "read_committed", len(want_out), 120)
    missing = sorted(int(i[1:]) for i in want_out - {e.id for e in out})
    assert not missing, f"missing {len(missing)} outputs: e{missing[:20]} ... e{missing[-5:]}"
    check_exactly_once_in_key_order(out, want_out)
    assert all(e.data["half"] == e.data["n"] / 2 for e in out)
    dead = await read(bootstrap, dlq, "read_committed", len(want_dead), 60)
    counts = Counter(e.id for e in dead)
    assert set(counts) == want_dead and max(counts.values()) == 1, counts.most_common(3)
    return out
