"""What an idle EventBus costs: CPU of the stack's processes with 0, 1 and 10 idle warm
pipelines and 50 pipelines scaled to zero, the latency of the first event after a while of
idleness (warm), and the cold start from zero with its breakdown.

The stack is ``eventbus up`` in a fresh ``EVENTBUS_HOME`` (Tansu, Redis, a Ray head, the
gateway); pipelines are filter-only (kafka -> filter -> kafka), deployed through the gateway's
admin API (``POST /v1/admin/pipelines``, what ``eventbus deploy`` does without starting a Ray
driver each time). CPU is the user+system time of the stack's processes (the broker, Redis,
the gateway, and every process under the Ray head's temp directory with their children: GCS,
raylet, Serve's controller, the EventBus controller, replicas) over ``--window-s`` seconds, in
percent of one core; other processes on the machine are not counted. The stack with no
pipeline, measured first in the same run, is the baseline of the per-pipeline figures.

1. ``--warm`` (10) pipelines with ``replicas: {min: 1}``: CPU with the first one deployed and
   with all; then, ``--idle-s`` after anything happened, one event to the first pipeline and
   the time until its output is read from the sink (``--rounds``, median).
2. The warm pipelines are deleted and ``--zero`` (50) pipelines with ``replicas: {min: 0,
   idle_s: --zero-idle-s}`` deployed (a few at a time: each starts with one replica and goes to
   zero after ``idle_s``); CPU once all are at zero.
   Idle replicas' Kafka sources park (no fetch) and the controller's ringer wakes them
   (``serving/_doorbell.py``): the first event waits for the ringer's next look and a fetch.
3. Cold start (``--cold-rounds``): one event to a pipeline at zero, and the time to its
   output, broken down: ``detect`` (event produced -> the controller's watcher starts the
   wake-up), ``schedule`` (-> the replica's worker process exists) and ``boot`` (-> the
   replica's constructor runs: Ray worker start, imports, Serve's replica set-up), or
   ``start`` for both when Ray reused a worker process it had started before, ``init`` (->
   its sources start: the pipeline's runner and canary router), ``join`` (-> its consumer
   group assigned partitions: sinks, consumer start, group join), ``first`` (-> the output is
   read). Ray's own marks from its logs come beside them (``ray_*_at_s``, seconds after
   the event was produced): Serve asked for the replica actor, a worker process started,
   the actor's creation began, the actor is alive.

Last line: one JSON object with every figure (each CPU figure with its per-role split).

Run: ``.venv/bin/python benchmarks/idle.py [--window-s 30] [--idle-s 15] [--zero 50]``
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import httpx  # noqa: E402
import psutil  # noqa: E402
import yaml  # noqa: E402
from _broker import add_broker_arg, start_broker  # noqa: E402

TARGETS = {
    "warm_10_cpu_pct": 10.0,
    "host_10_cpu_pct": 10.0,
    "first_event_ms": 100.0,
    "zero_50_cpu_pct": 5.0,
    "cold_start_s": 3.0,
}


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


def stack_processes(home: Path, broker_pids: list[int]) -> dict[int, str]:
    """pid -> role of every process of the stack recorded in ``home``, and of the broker the
    benchmark started (``broker_pids``, role ``kafka``)."""
    doc = json.loads((home / "stack.json").read_text())
    out: dict[int, str] = dict.fromkeys(broker_pids, "kafka")
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
        ("ray::IDLE", "ray-idle-worker"),
        ("DashboardAgent", "ray-agent"),
        ("RuntimeEnvAgent", "ray-agent"),
        ("dashboard/dashboard.py", "ray-dashboard"),
        ("autoscaler/_private/monitor.py", "ray-autoscaler"),
        ("log_monitor.py", "ray-log-monitor"),
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


def measure(home: Path, window_s: float, broker_pids: list[int]) -> dict[str, Any]:
    """CPU of the stack over ``window_s``: total and per role, in % of one core; and the
    resident memory of its processes at the end (MiB; shared pages counted in each)."""
    pids = stack_processes(home, broker_pids)
    before = cpu_times(pids)
    start = time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - start
    after = cpu_times(pids)
    # processes that started meanwhile are missed; the per-role names come again from the titles
    roles: dict[str, float] = {}
    for pid, t in after.items():
        if pid in before:
            # a Ray worker's title changes when it becomes an actor: named at the end
            owned = pids[pid] in ("kafka", "redis", "gateway")
            role = pids[pid] if owned else _role(psutil.Process(pid))
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
        # the machine is shared: how busy it was (1-minute load average at the end)
        "loadavg_1m": round(os.getloadavg()[0], 1),
        "by_role_pct": {k: round(100 * v / elapsed, 1) for k, v in sorted(roles.items())},
    }


def pipeline_doc(
    name: str, serving: dict[str, Any], source_bootstrap: str | None
) -> dict[str, Any]:
    """A filter-only pipeline; ``source_bootstrap``: its source's ``bootstrap_servers`` (None:
    the stack's Kafka)."""
    source: dict[str, Any] = {"topic": f"{name}-in", "create": {"partitions": 1}}
    if source_bootstrap is not None:
        source["bootstrap_servers"] = source_bootstrap
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": source}],
            "steps": [{"id": "keep", "filter": "type != 'drop'"}],
            "sink": {"kafka": {"topic": f"{name}-out", "create": {"partitions": 1}}},
            "serving": serving,
        },
    }


class Admin:
    """The gateway's admin API of the stack in ``home``."""

    def __init__(self, home: Path) -> None:
        doc = json.loads((home / "stack.json").read_text())
        token = (home / "admin_token").read_text().strip()
        self.http = httpx.Client(
            base_url=doc["gateway_http"],
            headers={"Authorization": f"Bearer {token}"},
            timeout=300,
        )

    def deploy(self, doc: dict[str, Any]) -> None:
        r = self.http.post("/v1/admin/pipelines", content=yaml.safe_dump(doc))
        if r.status_code != 201:
            msg = f"deploying {doc['metadata']['name']} failed: {r.status_code} {r.text}"
            raise RuntimeError(msg)

    def delete(self, name: str) -> None:
        r = self.http.delete(f"/v1/admin/pipelines/{name}")
        if r.status_code not in (204, 404):
            raise RuntimeError(f"deleting {name} failed: {r.status_code} {r.text}")


def redis_of(home: Path) -> Any:
    from eventbus._internal.redis_client import connect

    return connect(
        json.loads((home / "stack.json").read_text())["redis_url"], decode_responses=True
    )


def at_zero(redis: Any) -> set[str]:
    from eventbus._internal import keys

    return {
        name
        for name, raw in redis.hgetall(keys.SCALED_TO_ZERO).items()
        if "waking_at" not in json.loads(raw)
    }


def settled(redis: Any) -> set[str]:
    """The pipelines at zero whose scale-down the controller finished (application gone)."""
    from eventbus._internal import keys

    return {
        name
        for name, raw in redis.hgetall(keys.SCALED_TO_ZERO).items()
        if "settled_at" in json.loads(raw) and "waking_at" not in json.loads(raw)
    }


def waking(redis: Any) -> set[str]:
    """The pipelines whose wake-up from zero is under way."""
    from eventbus._internal import keys

    return {
        name
        for name, raw in redis.hgetall(keys.SCALED_TO_ZERO).items()
        if "waking_at" in json.loads(raw)
    }


def wait_until(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(0.2)


async def first_event_latency(bootstrap: str, src: str, sink: str) -> tuple[float, float]:
    """Produce one event to ``src``; (epoch s when it was produced, seconds until its output
    was read from ``sink``)."""
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
        t0, wall0 = time.monotonic(), time.time()
        await producer.send_and_wait(src, b"{}", headers=headers)
        deadline = t0 + 120
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=50)
            for recs in batch.values():
                for r in recs:
                    if dict(r.headers or ()).get("ce_id") == marker.encode():
                        return wall0, time.monotonic() - t0
        raise TimeoutError("the event did not come out of the pipeline within 120 s")
    finally:
        await producer.stop()
        await consumer.stop()


def cold_start(home: Path, redis: Any, bootstrap: str, name: str) -> dict[str, float]:
    """One event to ``name`` (at zero): the total and its breakdown, in seconds."""
    from eventbus._internal import keys

    wall0, total = asyncio.run(first_event_latency(bootstrap, f"{name}-in", f"{name}-out"))
    waking_at = None
    raw_zero = redis.hget(keys.SCALED_TO_ZERO, name)  # cleared once the replica runs
    if raw_zero:
        waking_at = json.loads(raw_zero).get("waking_at")
    startup: dict[str, float] = {}
    pid = None
    for entry_id, raw in redis.hgetall(keys.stats(name)).items():
        entry = json.loads(raw)
        st = entry.get("startup") or {}
        if not entry.get("final") and st.get("init_at", 0) > wall0 - 1:
            startup, pid = st, int(entry_id.split("-")[0])
    out = {"total_s": round(total, 3)}
    if raw_zero:  # who saw the events: the ringer's look ("doorbell") or the watcher's poll
        out["woken_by_doorbell"] = int(json.loads(raw_zero).get("woken_by") == "doorbell")
    proc_at = process_started_at(pid) if pid else None
    marks = [("detect_s", waking_at)]
    if proc_at is not None and waking_at is not None and proc_at > waking_at:
        marks += [("schedule_s", proc_at), ("boot_s", startup.get("init_at"))]
        out["new_worker_process"] = 1
    else:  # Ray gave the replica a worker process it had started before (its pool)
        marks += [("start_s", startup.get("init_at"))]
        out["new_worker_process"] = 0
    marks += [
        ("init_s", startup.get("sources_at")),
        ("join_s", startup.get("assigned_at")),
        ("first_s", wall0 + total),
    ]
    prev = wall0
    for label, at in marks:
        if at is None:
            continue
        out[label] = round(at - prev, 3)
        prev = at
    out.update(ray_marks(home, wall0))
    return out


def process_started_at(pid: int) -> float | None:
    """When process ``pid`` started (epoch s, to the kernel's clock tick). Not psutil's
    ``create_time()``: it adds the start's ticks to the boot time in whole seconds, so here
    a process started now read up to a second in the past (and every replica looked as if
    Ray had started its worker before the wake-up)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def ray_marks(home: Path, wall0: float) -> dict[str, float]:
    """Ray's own marks of the replica's start, from its core-worker logs, in seconds after
    the event was produced (``wall0``): ``ray_requested_at_s`` (the replica actor's first
    PENDING_CREATION notice: Serve asked for it), ``ray_process_at_s`` (a worker process
    that started after that constructs its core worker), ``ray_creating_at_s`` (it begins
    the actor's creation: the replica's class imported next), ``ray_alive_at_s`` (ALIVE)."""
    import datetime
    import re

    temp_dir = json.loads((home / "stack.json").read_text())["owned"].get("ray", {}).get("temp_dir")
    logs = Path(temp_dir or "/nonexistent") / "session_latest" / "logs"
    stamp = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
    found: dict[str, list[float]] = {}
    for path in logs.glob("python-core-*.log"):
        try:
            if path.stat().st_mtime < wall0:
                continue
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            m = stamp.match(line)
            if not m:
                continue
            at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at < wall0:
                continue
            for key, needle in (
                ("ray_requested_at_s", "state: PENDING_CREATION"),
                ("ray_process_at_s", "Constructing CoreWorkerProcess"),
                ("ray_creating_at_s", "Creating actor"),
                ("ray_alive_at_s", "state: ALIVE"),
            ):
                if needle in line:
                    found.setdefault(key, []).append(at)
    out: dict[str, float] = {}
    prev = wall0
    for key in ("ray_requested_at_s", "ray_process_at_s", "ray_creating_at_s", "ray_alive_at_s"):
        later = [t for t in found.get(key, []) if t >= prev]
        if not later:
            break
        prev = min(later)
        out[key] = round(prev - wall0, 3)
    return out


#: The variants ``--doorbell`` picks from: where the results go (``""``: the top level).
VARIANTS = {"on": ("doorbell",), "off": ("no_doorbell",), "both": ("doorbell", "no_doorbell")}


@dataclass
class Stack:
    """The stack under measurement and what each phase needs of it."""

    args: Any
    home: Path
    admin: Admin
    redis: Any
    bootstrap: str
    broker_pids: list[int]
    started: list[bool] = field(default_factory=lambda: [False])  # the controller started

    def measure(self) -> dict[str, Any]:
        return measure(self.home, self.args.window_s, self.broker_pids)

    def deploy(self, doc: dict[str, Any]) -> None:
        deploy(self.home, self.admin, doc, self.started)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window-s", type=float, default=30.0, help="Seconds each CPU figure covers.")
    ap.add_argument("--settle-s", type=float, default=15.0, help="Wait before each measurement.")
    ap.add_argument("--idle-s", type=float, default=15.0, help="Idleness before a first event.")
    ap.add_argument("--rounds", type=int, default=3, help="First-event rounds (median).")
    ap.add_argument("--warm", type=int, default=10, help="Idle warm pipelines (min: 1).")
    ap.add_argument("--zero", type=int, default=50, help="Pipelines scaled to zero (min: 0).")
    ap.add_argument("--zero-idle-s", type=float, default=3.0, help="Their replicas.idle_s.")
    ap.add_argument("--zero-poll-s", type=float, default=1.0, help="Their replicas.poll_s.")
    ap.add_argument("--cold-rounds", type=int, default=3, help="Cold starts (median).")
    ap.add_argument(
        "--max-waking",
        type=int,
        default=3,
        help="Most min: 0 pipelines not yet at zero while deploying.",
    )
    ap.add_argument(
        "--phases",
        default="own,host,zero",
        help="Which to run, in order, after the no-pipeline baseline: own (--warm pipelines "
        "each in replicas of its own), host (--warm pipelines on one shared host, "
        "serving.host), zero (--zero pipelines at zero, then the cold starts).",
    )
    ap.add_argument(
        "--doorbell",
        choices=sorted(VARIANTS),
        default="on",
        help="on: the pipelines read the stack's own Kafka, so the stack's mechanisms for it "
        "work (idle sources park and the controller's ringer rings them, the ringer nudges "
        "the scale-to-zero watcher, a woken replica bridges its group join); off: each "
        "pipeline's source names the same broker by another address (localhost:PORT), as "
        "another cluster, so none of them does (idle sources long-poll, the watcher wakes a "
        "pipeline at its poll_s, the woken replica waits for its group join); both: the "
        "phases with on, then again with off (its figures under no_doorbell).",
    )
    add_broker_arg(ap)
    args = ap.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - {"own", "host", "zero"})
    if unknown:
        ap.error(f"--phases: unknown phase(s) {', '.join(unknown)}; use own, host, zero")
    home = Path(tempfile.mkdtemp(prefix="eventbus-idle-"))
    result: dict[str, Any] = {
        "broker": args.broker,
        "doorbell": args.doorbell,
        "window_s": args.window_s,
        "targets": TARGETS,
        "phases": phases,
    }
    # the broker is the benchmark's (its processes counted as the stack's, role "kafka");
    # `eventbus up` adopts it
    broker = start_broker(args.broker, Path(tempfile.mkdtemp(prefix="eventbus-idle-broker-")))
    try:
        eventbus(home, "up", "--kafka-bootstrap", broker.bootstrap)
        try:
            stack = Stack(args, home, Admin(home), redis_of(home), broker.bootstrap, broker.pids)
            time.sleep(args.settle_s)
            result["idle_0"] = stack.measure()
            print("0 pipelines:", result["idle_0"], flush=True)
            for variant in VARIANTS[args.doorbell]:
                into = result if variant == "doorbell" else result.setdefault(variant, {})
                # another address of the same broker: EventBus takes it for another cluster
                alias = None if variant == "doorbell" else _alias(broker.bootstrap)
                run_phases(stack, phases, alias, into, variant)
                summarise(args, into, result["idle_0"]["cpu_pct"])
            if args.doorbell == "both":
                result["doorbell_effect"] = compare(args, result)
        finally:
            try:
                eventbus(home, "down")
            except Exception as exc:  # noqa: BLE001
                print(f"eventbus down failed: {exc}", file=sys.stderr)
    finally:
        broker.stop()
    print(json.dumps(result))


def _alias(bootstrap: str) -> str:
    return ",".join(f"localhost:{a.rsplit(':', 1)[1]}" for a in bootstrap.split(","))


def run_phases(
    stack: Stack, phases: list[str], alias: str | None, result: dict[str, Any], label: str
) -> None:
    """The ``phases`` with pipelines whose source reads ``alias`` (None: the stack's Kafka)."""
    args = stack.args
    tag = uuid.uuid4().hex[:4]

    def deploy_warm(names: list[str], serving: dict[str, Any], kind: str) -> None:
        if not names:  # --warm 0: the scale to zero and the cold starts only
            return
        for i, name in enumerate(names):
            stack.deploy(pipeline_doc(name, serving, alias))
            if i == 0:
                time.sleep(args.settle_s)
                result[f"{kind}_1"] = stack.measure()
                print(f"{label}: 1 {kind} pipeline:", result[f"{kind}_1"], flush=True)
        time.sleep(args.settle_s)
        result[f"{kind}_{args.warm}"] = stack.measure()
        print(f"{label}: {args.warm} {kind} pipelines:", result[f"{kind}_{args.warm}"], flush=True)
        latencies = []
        for _ in range(args.rounds):
            time.sleep(args.idle_s)
            _, lat = asyncio.run(
                first_event_latency(stack.bootstrap, f"{names[0]}-in", f"{names[0]}-out")
            )
            latencies.append(lat)
            print(f"{label}: {kind}: first event after {args.idle_s:g} s idle: {lat * 1000:.0f} ms")
        prefix = "" if kind == "warm" else f"{kind}_"
        result[f"{prefix}first_event_ms"] = round(1000 * statistics.median(latencies))
        result[f"{prefix}first_event_ms_all"] = [round(1000 * x) for x in latencies]
        for name in names:
            stack.admin.delete(name)

    if "own" in phases:
        names = [f"w-{tag}-{i}" for i in range(args.warm)]
        deploy_warm(names, {"replicas": {"min": 1, "max": 1}}, "warm")
    if "host" in phases:
        # the same pipelines in ONE process: the replica of host `idle-<tag>`
        names = [f"s-{tag}-{i}" for i in range(args.warm)]
        deploy_warm(names, {"replicas": 1, "host": f"idle-{tag}"}, "host")
    if "zero" in phases:
        zero_and_cold(stack, alias, tag, result, label)


def deploy(home: Path, admin: Admin, doc: dict[str, Any], started: list[bool]) -> None:
    """Deploy through the admin API; the first through the CLI (it starts the controller)."""
    if started[0]:
        admin.deploy(doc)
        return
    path = home / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    eventbus(home, "deploy", str(path))
    started[0] = True


def zero_and_cold(
    stack: Stack, alias: str | None, tag: str, result: dict[str, Any], label: str
) -> None:
    """Phase ``zero``: ``--zero`` pipelines at zero, their CPU, then the cold starts; the
    pipelines are deleted after (a later variant measures its own)."""
    args, redis = stack.args, stack.redis
    zero = [f"z-{tag}-{i}" for i in range(args.zero)]
    serving = {
        "replicas": {"min": 0, "max": 1, "idle_s": args.zero_idle_s, "poll_s": args.zero_poll_s}
    }
    t_deploy = time.monotonic()
    for i, name in enumerate(zero):
        wait_until(
            lambda i=i: i - len(at_zero(redis) & set(zero[:i])) < args.max_waking,
            120,
            "the earlier pipelines' scale to zero",
        )
        stack.deploy(pipeline_doc(name, serving, alias))
    wait_until(lambda: at_zero(redis) >= set(zero), 300, f"all {args.zero} at zero")
    result["zero_deploy_s"] = round(time.monotonic() - t_deploy, 1)
    time.sleep(args.settle_s)
    result[f"zero_{args.zero}"] = stack.measure()
    print(f"{label}: {args.zero} pipelines at zero:", result[f"zero_{args.zero}"], flush=True)

    colds = []
    for i, name in enumerate(zero[: args.cold_rounds]):
        # the previous wake-up has ended and that pipeline is back at zero (the controller
        # scales one pipeline at a time: a wake or scale-down running meanwhile would count
        # the wait for it as this one's detection)
        wait_until(
            lambda i=i: set(zero[: i + 1]) <= settled(redis) and not waking(redis),
            120,
            "the previous cold start's pipeline back at zero",
        )
        cold = cold_start(stack.home, redis, stack.bootstrap, name)
        colds.append(cold)
        print(f"{label}: cold start of {name}: {cold}", flush=True)
    result["cold_start_all"] = colds
    if colds:
        result["cold_start_s"] = round(statistics.median(c["total_s"] for c in colds), 2)
        keys_ = sorted({k for c in colds for k in c if k != "total_s"})
        result["cold_start_breakdown_s"] = {
            k: round(statistics.median(c[k] for c in colds if k in c), 3) for k in keys_
        }
    for name in zero:
        stack.admin.delete(name)


def summarise(args: Any, result: dict[str, Any], base: float) -> None:
    """Per-pipeline figures, targets met, and the ratios to the no-pipeline baseline
    (``base``, % of a core) and (with both warm phases) of a shared host to pipelines in
    replicas of their own."""
    met: dict[str, bool] = {}
    for label, count in (("warm", args.warm), ("host", args.warm), ("zero", args.zero)):
        key = f"{label}_{count}"
        if key not in result:
            continue
        cpu = result[key]["cpu_pct"]
        result[f"{label}_per_pipeline_pct"] = round((cpu - base) / max(1, count), 3)
        # the ratio to the stack's own baseline (no pipeline), measured in this run
        result[f"ratio_{label}_to_base"] = round(cpu / max(base, 0.1), 2)
        if f"{key}_cpu_pct" in TARGETS:
            met[f"{key}_cpu_pct"] = cpu < TARGETS[f"{key}_cpu_pct"]
    for prefix in ("", "host_"):
        if f"{prefix}first_event_ms" in result:
            met[f"{prefix}first_event_ms"] = (
                result[f"{prefix}first_event_ms"] < TARGETS["first_event_ms"]
            )
    if "cold_start_s" in result:
        met["cold_start_s"] = result["cold_start_s"] < TARGETS["cold_start_s"]
    if f"warm_{args.warm}" in result and f"host_{args.warm}" in result:
        result["ratio_host_to_own"] = round(
            result[f"host_{args.warm}"]["cpu_pct"]
            / max(result[f"warm_{args.warm}"]["cpu_pct"], 0.1),
            2,
        )
    result["met"] = met


def compare(args: Any, result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The figures the doorbell, the ringer and the join bridge change, with and without."""
    off = result.get("no_doorbell", {})
    out: dict[str, dict[str, Any]] = {}
    for key in (
        f"warm_{args.warm}",
        f"host_{args.warm}",
        f"zero_{args.zero}",
        "warm_per_pipeline_pct",
        "host_per_pipeline_pct",
        "zero_per_pipeline_pct",
        "first_event_ms",
        "host_first_event_ms",
        "cold_start_s",
    ):
        on_v, off_v = result.get(key), off.get(key)
        if isinstance(on_v, dict):  # a CPU figure: its total
            on_v, off_v = on_v.get("cpu_pct"), (off_v or {}).get("cpu_pct")
        if on_v is not None or off_v is not None:
            name = f"{key}_cpu_pct" if key[-1].isdigit() else key
            out[name] = {"doorbell": on_v, "no_doorbell": off_v}
    return out


if __name__ == "__main__":
    main()
