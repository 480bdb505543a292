"""The systems of ``peers.py``: how each starts on a topic pair, stops, and is timed.

Every system but EventBus runs as a process of its own: the frameworks with the interpreter of
their own venv under ``.venv-bench/<peer>`` (``make bench`` makes them from
``peer_apps/requirements-<peer>.txt``: their pins never touch the project's dependencies nor
each other's), the aiokafka loop with the project's. EventBus is deployed on the local Ray
cluster with the same client as ``kafka_pipeline.py``.

Every system is timed the same way, by the wall clock at the sink: ``peer_apps/tail_clock.py``
(a librdkafka consumer, cheap) takes the span from the first output's arrival to the last's.
Broker timestamps cannot be used: Quix Streams stamps each output with its input's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from _common import PARTITIONS, PIPELINE, latency_run
from _peer_windows import BYTEWAX_WAIT_S, T0
from _peer_windows import PIPELINE as WINDOW_PIPELINE
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
APPS = Path(__file__).resolve().parent / "peer_apps"
VENVS = ROOT / ".venv-bench"

# name -> (venv under .venv-bench or None for the project's interpreter, command after it)
PROCESS_PEERS: dict[str, tuple[str | None, list[str]]] = {
    "quixstreams": ("quixstreams", [str(APPS / "quixstreams_app.py")]),
    "bytewax": ("bytewax", ["-m", "bytewax.run", "bytewax_app:flow"]),
    "faust": ("faust", [str(APPS / "faust_app.py")]),
    "aiokafka_loop": (None, [str(APPS / "aiokafka_loop.py")]),
    "confluent_loop": ("confluent", [str(APPS / "confluent_loop.py")]),
}
# the tumbling count per key (``_peer_windows.py``): the frameworks' own windowing
WINDOW_PEERS: dict[str, tuple[str | None, list[str]]] = {
    "quixstreams": ("quixstreams", [str(APPS / "quixstreams_window.py")]),
    "bytewax": ("bytewax", ["-m", "bytewax.run", "bytewax_window:flow"]),
    "faust": ("faust", [str(APPS / "faust_window.py")]),
}
FRAMEWORKS = ("quixstreams", "bytewax", "faust")
LOOPS = ("aiokafka_loop", "confluent_loop")


class PeerError(RuntimeError):
    """A system could not run here; the message says why (the peer's own error where it has one)."""


@dataclass
class Running:
    name: str
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    pipeline: str | None = None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            msg = f"{self.name} exited with {self.proc.returncode}: {tail(self.log)}"
            raise PeerError(msg)


def tail(path: Path | None, lines: int = 6) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()
    return " | ".join(line.strip() for line in text[-lines:])


def pids(run: Running) -> list[int]:
    """The processes that run ``run``'s pipeline: the peer's, or EventBus's Serve replicas."""
    if run.proc is not None:
        return [run.proc.pid]
    import psutil

    prefix = f"ray::ServeReplica:eventbus-{run.pipeline}:"
    found = []
    # descendants only: other Ray clusters on the machine may run replicas of the same name
    for p in psutil.Process().children(recursive=True):
        try:
            if (p.cmdline() or [""])[0].startswith(prefix):
                found.append(p.pid)
        except psutil.Error:  # a worker that exited meanwhile
            continue
    if not found:
        msg = f"{run.name}: no replica process {prefix}* among this benchmark's processes"
        raise PeerError(msg)
    return found


class Systems:
    """Starts and stops the systems on one broker (and, for EventBus, one Ray cluster)."""

    def __init__(self, bootstrap: str, work: Path, client: Any) -> None:
        self.bootstrap = bootstrap
        self.work = work
        self.client = client
        self._n = 0

    def start(self, name: str, src: str, sink: str, scenario: str = "filter_convert") -> Running:
        """Start ``name`` on ``src`` → ``sink``; ``scenario``: ``filter_convert`` or
        ``tumbling_count`` (its pipeline: ``_peer_windows.py``)."""
        self._n += 1
        group = f"{name.replace('_', '-')}-{self._n}"
        windows = scenario == "tumbling_count"
        if name.startswith("eventbus"):
            replicas = int(name.rsplit("_", 1)[1])
            path = self.work / f"{group}.yaml"
            template = WINDOW_PIPELINE if windows else PIPELINE
            path.write_text(
                template.format(name=f"peers{self._n}", src=src, sink=sink, replicas=replicas)
            )
            self.client.deploy(path)
            return Running(name, pipeline=f"peers{self._n}")
        venv, cmd = (WINDOW_PEERS if windows else PROCESS_PEERS)[name]
        python = sys.executable if venv is None else str(VENVS / venv / "bin" / "python")
        if not Path(python).exists():
            msg = f"{name}: {python} is missing; `make bench` installs the peers (.venv-bench)"
            raise PeerError(msg)
        log = self.work / f"{group}.log"
        env = {
            **os.environ,
            "PEER_BOOTSTRAP": self.bootstrap,
            "PEER_SOURCE": src,
            "PEER_SINK": sink,
            "PYTHONPATH": str(APPS),
            "PEER_ALIGN_MS": str(T0),  # bytewax_window.py: the first window's start
            "PEER_WAIT_S": str(BYTEWAX_WAIT_S),  # and its EventClock's wait
        }
        with log.open("wb") as out:
            proc = subprocess.Popen(
                # bytewax.run takes the flow's import string alone: the flow reads PEER_* env
                [python, *cmd] + ([] if name == "bytewax" else [self.bootstrap, src, sink, group]),
                cwd=self.work,  # where Quix and Faust keep their state directories
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return Running(name, proc=proc, log=log)

    def stop(self, run: Running) -> None:
        if run.pipeline is not None:
            self.client.delete(run.pipeline)
            return
        assert run.proc is not None
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGTERM)
            try:
                run.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()


def start_clock(
    bootstrap: str, sink: str, expect: int, timeout_s: float = 40, partitions: int = PARTITIONS
) -> subprocess.Popen[bytes]:
    """Start ``peer_apps/tail_clock.py`` on ``sink``; returns once it fetches."""
    python = VENVS / "confluent" / "bin" / "python"
    if not python.exists():
        msg = f"{python} is missing (the sink's clock runs there); `make bench` installs it"
        raise PeerError(msg)
    args = [bootstrap, sink, str(partitions), str(expect), str(timeout_s)]
    proc = subprocess.Popen(
        [str(python), str(APPS / "tail_clock.py"), *args], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        msg = f"the sink clock did not start (exit {proc.wait()})"
        raise PeerError(msg)
    return proc


def read_clock(
    clock: subprocess.Popen[bytes], run: Running, expect: int
) -> tuple[float, float, int]:
    """Wait for the clock's answer (first, last, count), failing fast if the system exits."""
    while clock.poll() is None:
        try:
            run.check_alive()
        except PeerError:
            clock.kill()
            clock.wait()
            raise
        time.sleep(0.05)  # a poll of two processes' exit: the clock itself does the timing
    assert clock.stdout is not None
    out = json.loads(clock.stdout.read().decode().strip().splitlines()[-1])
    if out["count"] < max(1, expect // 20):  # too few to time: it did not really run
        msg = f"{run.name}: {out['count']} of {expect} outputs arrived; {tail(run.log)}"
        raise PeerError(msg)
    return float(out["first"]), float(out["last"]), int(out["count"])


async def verify_sink(
    bootstrap: str, sink: str, expect: int, name: str, *, at_least: int | None = None
) -> None:
    """Read the sink back: ``expect`` records (``at_least`` of them, when the round was cut
    short), each converted and retyped."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    parts = [TopicPartition(sink, p) for p in range(PARTITIONS)]
    consumer.assign(parts)
    seen = 0
    deadline = time.monotonic() + 60
    try:
        # Tansu's end offsets are its last batch's base offset: read until the topic is quiet
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=20000)
            if not batch and seen >= (expect if at_least is None else at_least):
                break
            for records in batch.values():
                for r in records:
                    seen += 1
                    data = orjson.loads(r.value)
                    ce_type = dict(r.headers).get("ce_type")
                    if ce_type != b"payment.large" or data["amount_cny"] != data["amount"] * 7.1:
                        msg = f"{name}: wrong output {data!r} with ce_type {ce_type!r}"
                        raise PeerError(msg)
    finally:
        await consumer.stop()
    if seen > expect or seen < (expect if at_least is None else at_least):
        msg = f"{name}: {seen} outputs on {sink}, expected {expect}"
        raise PeerError(msg)


async def wait_ready(
    bootstrap: str, src: str, sink: str, run: Running, timeout_s: float = 90
) -> int:
    """Send probe events until each comes out at the sink (the system has joined and runs).

    Returns:
        How many probes came out.
    """
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    await producer.start()
    await consumer.start()
    consumer.assign([TopicPartition(sink, p) for p in range(PARTITIONS)])
    arrived = 0
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_source", b"/probe"),
        ("ce_type", b"payment.created"),
    ]
    try:
        deadline = time.monotonic() + timeout_s
        sent = 0
        while time.monotonic() < deadline:
            value = orjson.dumps({"amount": 500, "currency": "USD", "t0": time.time()})
            hdrs = [*headers, ("ce_id", f"probe{sent}".encode())]
            await producer.send_and_wait(src, value, partition=sent % PARTITIONS, headers=hdrs)
            sent += 1
            wait_until = time.monotonic() + 0.5
            while time.monotonic() < wait_until:
                batch = await consumer.getmany(timeout_ms=50)
                arrived += sum(len(records) for records in batch.values())
                if arrived >= sent:
                    return arrived
                run.check_alive()
        msg = f"{run.name}: no probe event came out within {timeout_s:.0f} s"
        raise PeerError(msg)
    finally:
        await producer.stop()
        await consumer.stop()


async def measured_latency(
    bootstrap: str, src: str, sink: str, run: Running, rate: float, seconds: float
) -> list[float]:
    await wait_ready(bootstrap, src, sink, run)
    return await latency_run(bootstrap, src, sink, rate, seconds)
