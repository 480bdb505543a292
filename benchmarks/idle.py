"""What an idle EventBus costs: CPU of the stack's processes with 0, 1 and 10 idle pipelines,
and the latency of the first event after a while of idleness.

The stack is ``eventbus up`` in a fresh ``EVENTBUS_HOME`` (Tansu, Redis, a Ray head, the
gateway); pipelines are filter-only (kafka → filter → kafka), deployed with ``eventbus deploy``
(the CLI's Ray driver leaves before anything is measured). CPU is the user+system time of the
stack's processes (the broker, Redis, the gateway, and every process under the Ray head's temp
directory with their children: GCS, raylet, Serve's controller, the EventBus controller,
replicas) over ``--window-s`` seconds, in percent of one core; other processes on the machine
are not counted. After the measurements, one event is produced to the first pipeline's topic
``--idle-s`` after anything happened, and the time until its output is read from the sink is
the first-event latency (the rounds' median).

Last line: one JSON object with the figures.

Run: ``.venv/bin/python benchmarks/idle.py [--window-s 30] [--idle-s 20] [--rounds 3]``
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
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import psutil  # noqa: E402
import yaml  # noqa: E402


def eventbus(home: Path, *args: str, timeout: float = 300) -> str:
    env = {
        **os.environ,
        "EVENTBUS_HOME": str(home),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "eventbus.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        msg = f"eventbus {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        raise RuntimeError(msg)
    return proc.stdout


def stack_processes(home: Path) -> dict[int, str]:
    """pid -> role of every process of the stack recorded in ``home``."""
    doc = json.loads((home / "stack.json").read_text())
    out: dict[int, str] = {}
    for part, info in doc["owned"].items():
        if "pid" in info:
            out[int(info["pid"])] = part
    temp_dir = doc["owned"].get("ray", {}).get("temp_dir")
    roots: list[psutil.Process] = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if temp_dir and temp_dir in cmd:
            roots.append(p)
    for root in roots:
        try:
            family = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in family:
            out.setdefault(p.pid, _role(p))
    for pid in list(out):  # children of the broker, Redis, the gateway
        try:
            for c in psutil.Process(pid).children(recursive=True):
                out.setdefault(c.pid, out[pid])
        except psutil.NoSuchProcess:
            pass
    return out


def _role(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline())
        title = p.name()
    except psutil.Error:
        return "ray"
    for key, role in (
        ("ServeReplica", "replica"),
        ("ServeController", "serve-controller"),
        ("Controller", "eventbus-controller"),
        ("gcs_server", "ray-gcs"),
        ("raylet", "raylet"),
    ):
        if key in cmd or key in title:
            return role
    return "ray-other"


def cpu_times(pids: dict[int, str]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return out


def measure(home: Path, window_s: float) -> dict[str, Any]:
    """CPU of the stack over ``window_s``: total and per role, in % of one core; and the
    resident memory of its processes at the end (MiB; shared pages counted in each)."""
    pids = stack_processes(home)
    before = cpu_times(pids)
    start = time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - start
    after = cpu_times(pids)
    # processes that started meanwhile are missed; the per-role names come again from the titles
    roles: dict[str, float] = {}
    for pid, t in after.items():
        if pid in before:
            role = pids[pid] if pids[pid] != "ray-other" else _role(psutil.Process(pid))
            roles[role] = roles.get(role, 0.0) + (t - before[pid])
    total = sum(roles.values())
    rss = 0
    for pid in after:
        try:
            rss += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return {
        "cpu_pct": round(100 * total / elapsed, 1),
        "rss_mb": round(rss / 2**20),
        "by_role_pct": {k: round(100 * v / elapsed, 1) for k, v in sorted(roles.items())},
    }


def pipeline_doc(name: str, src: str, sink: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": src}}],
            "steps": [{"id": "keep", "filter": "type != 'drop'"}],
            "sink": {"kafka": {"topic": sink}},
            **extra,
        },
    }


async def first_event_latency(bootstrap: str, src: str, sink: str) -> float:
    """Seconds from producing one event to ``src`` to reading its output from ``sink``."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    consumer = AIOKafkaConsumer(
        sink, bootstrap_servers=bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=5
    )
    await consumer.start()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=0)
    await producer.start()
    try:
        await consumer.seek_to_end()
        for tp in consumer.assignment():  # resolve the positions before producing
            await consumer.position(tp)
        marker = uuid.uuid4().hex
        headers = [
            ("ce_specversion", b"1.0"),
            ("ce_id", marker.encode()),
            ("ce_source", b"/idle-bench"),
            ("ce_type", b"keep"),
            ("content-type", b"application/json"),
        ]
        t0 = time.monotonic()
        await producer.send_and_wait(src, b"{}", headers=headers)
        deadline = t0 + 120
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=50)
            for recs in batch.values():
                for r in recs:
                    if dict(r.headers or ()).get("ce_id") == marker.encode():
                        return time.monotonic() - t0
        raise TimeoutError("the event did not come out of the pipeline within 120 s")
    finally:
        await producer.stop()
        await consumer.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window-s", type=float, default=30.0, help="Seconds each CPU figure covers.")
    ap.add_argument(
        "--settle-s", type=float, default=15.0, help="Wait after deploys before measuring."
    )
    ap.add_argument(
        "--idle-s", type=float, default=20.0, help="Idleness before the first-event latency."
    )
    ap.add_argument("--rounds", type=int, default=3, help="First-event latency rounds (median).")
    ap.add_argument("--pipelines", type=int, default=10, help="Pipelines of the largest figure.")
    ap.add_argument(
        "--serving",
        default="{}",
        help="JSON of the pipelines' spec.serving (e.g. replicas bounds); default: the defaults.",
    )
    args = ap.parse_args()
    extra = {"serving": json.loads(args.serving)} if json.loads(args.serving) else {}
    home = Path(tempfile.mkdtemp(prefix="eventbus-idle-"))
    result: dict[str, Any] = {"window_s": args.window_s}
    eventbus(home, "up")
    try:
        bootstrap = json.loads((home / "stack.json").read_text())["kafka_bootstrap"]
        time.sleep(args.settle_s)
        result["idle_0"] = measure(home, args.window_s)
        print("0 pipelines:", result["idle_0"], flush=True)
        tag = uuid.uuid4().hex[:4]
        names = []
        for i in range(args.pipelines):
            name = f"idle-{tag}-{i}"
            names.append(name)
            path = home / f"{name}.yaml"
            path.write_text(yaml.safe_dump(pipeline_doc(name, f"{name}-in", f"{name}-out", extra)))
            eventbus(home, "deploy", str(path))
            if i == 0:
                time.sleep(args.settle_s)
                result["idle_1"] = measure(home, args.window_s)
                print("1 pipeline:", result["idle_1"], flush=True)
        time.sleep(args.settle_s)
        result[f"idle_{args.pipelines}"] = measure(home, args.window_s)
        print(f"{args.pipelines} pipelines:", result[f"idle_{args.pipelines}"], flush=True)
        latencies = []
        for _ in range(args.rounds):
            time.sleep(args.idle_s)
            lat = asyncio.run(first_event_latency(bootstrap, f"{names[0]}-in", f"{names[0]}-out"))
            latencies.append(lat)
            print(f"first event after {args.idle_s:g} s idle: {lat * 1000:.0f} ms", flush=True)
        result["first_event_ms"] = round(1000 * statistics.median(latencies))
        result["first_event_ms_all"] = [round(1000 * x) for x in latencies]
        per = (result[f"idle_{args.pipelines}"]["cpu_pct"] - result["idle_0"]["cpu_pct"]) / max(
            1, args.pipelines
        )
        result["per_pipeline_pct"] = round(per, 2)
    finally:
        try:
            eventbus(home, "down")
        except Exception as exc:  # noqa: BLE001
            print(f"eventbus down failed: {exc}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
