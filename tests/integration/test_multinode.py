"""EventBus on a two-node Ray cluster: a node dies mid-run, no event is lost.

A Ray head and a second node run as separate ``ray start`` processes on 127.0.0.1 (their own
temp dirs, explicit free ports, token authentication with a token of their own, as
``eventbus up`` starts its head). A pipeline with 2 replicas of one CPU each (one CPU per node)
puts one replica on each node; events are published while the second node's processes are
killed with SIGKILL; every event still reaches the sink (at least once: every id is there) and
the surviving replica keeps consuming, the dead one's partitions rebalanced to it.

The pytest process may hold the session's in-process Ray, and a process joins one Ray cluster
at most, so everything that talks to this cluster runs in ``multinode_driver.py`` as a
subprocess. The session's Kafka-protocol broker and Redis are shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaConsumer

from eventbus import CloudEvent
from eventbus._internal.ray_head import RAY_ENV
from eventbus._internal.services import free_port, wait_for_port
from eventbus.eventing._codecs import decode_kafka
from eventbus.eventing._publish import publish_events
from tests.integration.kafka_helpers import reader_gaps

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parents[2]

RAY = str(Path(sys.executable).parent / "ray")


def _ports(flags: list[str]) -> list[str]:
    return [f"--{flag}={free_port()}" for flag in flags]


# Every process of a node inherits this from its `ray start`: the node's temp dir.
_MARKER = "EVENTBUS_TEST_RAY_NODE"

# Ports every node opens; left to Ray, two nodes on one machine (or another cluster's node)
# would ask for the same fixed defaults (dashboard agent 52365, Ray Client 10001).
_NODE_PORTS = [
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
]


# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is what keeps every Ray server on 127.0.0.1 (Ray then
# resolves "127.0.0.1" to loopback instead of the VM's address, and a node whose IP is loopback
# binds loopback only), but with it `ray start --address` refuses to add a node ("Multi-node
# Ray clusters are not supported on Windows and OSX"); with it set to 1, 127.0.0.1 is rewritten
# to the VM's address and the servers bind every interface. So the second node runs Ray's own
# `ray start` with the switch off everywhere except in that one refusal check.
_JOIN_SHIM = """
import sys, types
import ray._private.ray_constants as constants
from ray.scripts import scripts
allowed = types.ModuleType(constants.__name__)
allowed.__dict__.update(constants.__dict__)
allowed.ENABLE_RAY_CLUSTER = True
scripts.ray_constants = allowed
sys.argv[0] = "ray"
sys.exit(scripts.main())
"""


@dataclass
class TwoNodeCluster:
    """Addresses, environment and temp dirs of the cluster (see ``start``)."""

    root: Path
    address: str = ""
    client_port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    head_dir: str = ""
    worker_dir: str = ""
    log: Path | None = None

    @classmethod
    def start(cls, num_cpus_per_node: int = 1) -> TwoNodeCluster:
        """Start the head, then the second node; wait until both are alive.

        Ray's socket paths must stay under 107 bytes, so the temp dirs sit directly in the
        system temp dir. On failure everything started so far is stopped again.
        """
        root = Path(tempfile.mkdtemp(prefix="ebmn-", dir=tempfile.gettempdir()))
        cluster = cls(
            root=root,
            head_dir=str(root / "head"),
            worker_dir=str(root / "node2"),
            log=root / "start.log",
        )
        token = root / "token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
        env.update(RAY_ENV)
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)})
        # The head's metrics exporters have fixed default ports another head may hold.
        env.update(
            {"AUTOSCALER_METRIC_PORT": str(free_port()), "DASHBOARD_METRIC_PORT": str(free_port())}
        )
        cluster.env = env
        port = free_port()
        cluster.client_port = free_port()
        cluster.address = f"127.0.0.1:{port}"
        common = [
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus_per_node}",
            "--disable-usage-stats",
        ]
        try:
            cluster._ray_start(
                cluster.head_dir,
                "--head",
                "--labels=zone=a",
                f"--port={port}",
                f"--ray-client-server-port={cluster.client_port}",
                "--include-dashboard=false",
                f"--temp-dir={cluster.head_dir}",
                *common,
                *_ports(_NODE_PORTS),
            )
            wait_for_port("127.0.0.1", port, 30)
            cluster._ray_start(
                cluster.worker_dir,
                f"--address={cluster.address}",
                "--labels=zone=b",
                f"--temp-dir={cluster.worker_dir}",
                *common,
                *_ports(_NODE_PORTS),
                join=True,
            )
            cluster.wait_for_nodes(2, timeout_s=60)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _ray_start(self, temp_dir: str, *args: str, join: bool = False) -> None:
        argv = [sys.executable, "-c", _JOIN_SHIM, "start", *args] if join else [RAY, "start", *args]
        proc = subprocess.run(
            argv,
            env={**self.env, _MARKER: temp_dir},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert self.log is not None
        with self.log.open("a") as f:
            f.write(f"$ ray start {' '.join(args)}\n{proc.stdout}\n{proc.stderr}\n")
        if proc.returncode != 0:
            msg = f"`ray start {' '.join(args)}` failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            raise RuntimeError(msg)

    def alive_nodes(self) -> int:
        """How many nodes the GCS reports active (`ray status`: no dashboard, no driver)."""
        proc = subprocess.run(
            [RAY, "status", f"--address={self.address}"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0 or "Active:" not in proc.stdout:
            return -1
        active = proc.stdout.split("Active:", 1)[1].split("Pending:", 1)[0]
        return sum(
            1 for line in active.splitlines() if line.strip().split(" ")[-1].startswith("node_")
        )

    def wait_for_nodes(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (n := self.alive_nodes()) != count:
            if time.monotonic() > deadline:
                msg = (
                    f"expected {count} alive Ray nodes within {timeout_s:g} s; the GCS reports {n}"
                )
                raise TimeoutError(msg)
            time.sleep(0.5)

    def node_pids(self, temp_dir: str) -> list[int]:
        """Pids of the processes of the node started with ``temp_dir``, or of both nodes for the
        cluster's root: its raylet, agents and workers.

        Ray rewrites its workers' and agents' command lines (``ray::ServeReplica:...``), so
        they are found by the marker in the environment each node's ``ray start`` passes on.
        """
        needle = f"{_MARKER}={temp_dir}".encode()
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if needle in environ:
                pids.append(int(proc.name))
        return pids

    def kill_node(self, temp_dir: str) -> list[str]:
        """SIGKILL every process of one node, as if its machine died; their command lines."""
        pids = self.node_pids(temp_dir)
        names = []
        for pid in pids:
            with contextlib.suppress(OSError):
                names.append(
                    Path(f"/proc/{pid}/cmdline")
                    .read_bytes()
                    .split(b"\0")[0]
                    .decode(errors="replace")
                )
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert _wait_gone(pids, 10), f"processes of {temp_dir} survived SIGKILL"
        return names

    def stop(self) -> None:
        """Kill every process of both nodes (SIGTERM, then SIGKILL); safe to call twice."""
        for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGKILL):
            # Looked up again each round: a raylet may have started workers meanwhile.
            pids = self.node_pids(str(self.root))
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if _wait_gone(pids, 10) and not self.node_pids(str(self.root)):
                return

    def listening(self) -> list[str]:
        """``address:port`` of every TCP socket the cluster's processes listen on."""
        pids = set(self.node_pids(str(self.root)))
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=False).stdout
        found = []
        for line in out.splitlines():
            owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
            if owners & pids:
                found.append(line.split()[3])
        return found


def _wait_gone(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of ours stays a zombie until reaped; it holds nothing.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _driver(cluster: TwoNodeCluster, *args: str, timeout_s: float = 120) -> dict[str, Any]:
    """Run one step of ``multinode_driver.py`` against the cluster; its last line's JSON."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.multinode_driver",
            args[0],
            cluster.address,
            *args[1:],
        ],
        env=cluster.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, (
        f"driver {args[0]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    # Its last JSON line: Ray may print a warning of its own after it (lagging heartbeats...).
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    assert lines, f"driver {args[0]} printed no JSON line:\n{proc.stdout[-2000:]}"
    return json.loads(lines[-1])  # type: ignore[no-any-return]


@pytest.fixture
def two_nodes() -> Iterator[TwoNodeCluster]:
    cluster = TwoNodeCluster.start(num_cpus_per_node=1)
    try:
        yield cluster
    finally:
        cluster.stop()
        import shutil

        shutil.rmtree(cluster.root, ignore_errors=True)


def _events(start: int, n: int) -> list[CloudEvent]:
    return [
        CloudEvent.create(
            type="mn.created", source="/multinode", id=f"mn{i}", data={"n": i}, partitionkey=str(i)
        )
        for i in range(start, start + n)
    ]


class _Sink:
    """Reads the sink topic from the beginning, keeping every event (duplicates too)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        self.events: list[CloudEvent] = []
        self.gaps = reader_gaps()

    async def until(self, ids: set[str], timeout_s: float) -> set[str]:
        """Read until every id in ``ids`` arrived or the deadline passed; the missing ids."""
        deadline = time.monotonic() + timeout_s
        while True:
            missing = ids - {e.id for e in self.events}
            if not missing or time.monotonic() > deadline:
                return missing
            batch, _ = self.gaps.take(
                self.consumer,
                await self.consumer.getmany(timeout_ms=200, max_records=5000),
                time.monotonic(),
            )
            for tp, records in batch.items():
                for r in records:
                    self.events.append(
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
                    )


async def test_a_node_dies_mid_run_and_every_event_arrives(
    two_nodes: TwoNodeCluster,
    kafka_bootstrap: str,
    redis_url: str,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    cluster = two_nodes
    # a Redis database of its own: this cluster's controller stores its pipeline there, not
    # among the session stack's (whose controller would restore it on its next restart)
    redis_url = redis_url.rsplit("/", 1)[0] + "/11"
    for addr in cluster.listening():  # failure tests may only touch loopback
        assert addr.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")), cluster.listening()

    src, sink_topic = topic_factory("mn-in", partitions=4), topic_factory("mn-out", partitions=2)
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "multinode"},
        "spec": {
            "sources": [{"kafka": {"topic": src}}],
            "steps": [
                {"id": "only_created", "filter": "type == 'mn.created'"},
                {"id": "stamp", "function": "tests.integration.multinode_driver:stamp_node"},
            ],
            "sink": {"kafka": {"topic": sink_topic}},
            # Half a CPU per replica, one CPU per node: both replicas would fit on one node;
            # spread puts one on each, and keeps the second off the head once its node died.
            "serving": {
                "replicas": 2,
                "num_cpus": 0.5,
                "placement": {"spread": True},
                "batch": {"max_size": 200, "linger_ms": 5},
            },
        },
    }
    path = tmp_path / "multinode.yaml"
    # placement no live node can hold is refused at deploy, naming the nodes (zone a, zone b)
    for placement, expect in (
        ({"node_labels": {"zone": "c"}}, "no live Ray node has labels {zone: c}"),
        (
            {"spread": True, "node_labels": {"zone": "b"}},
            "asks at least 2 and 1 live Ray node(s) with labels {zone: b} can take one",
        ),
    ):
        refused = {
            **doc,
            "spec": {**doc["spec"], "serving": {"replicas": 2, "placement": placement}},
        }
        path.write_text(yaml.safe_dump(refused, sort_keys=False))
        got = _driver(cluster, "deploy", kafka_bootstrap, redis_url, str(path))
        assert expect in got.get("refused", ""), got
        assert "127.0.0.1 {zone: a}" in got["refused"], got
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    deployed = _driver(cluster, "deploy", kafka_bootstrap, redis_url, str(path))
    nodes = {n["node_id"]: n for n in deployed["nodes"]}
    head = next(n for n, info in nodes.items() if info["head"])
    [second] = [n for n in nodes if n != head]
    replica_nodes = sorted(r["node_id"] for r in deployed["replicas"])
    assert replica_nodes == sorted([head, second]), deployed

    sink = _Sink(kafka_bootstrap, sink_topic)
    await sink.consumer.start()
    try:
        # Both replicas serve: the first events are processed on both nodes.
        await publish_events(kafka_bootstrap, src, _events(0, 2000))
        missing = await sink.until({f"mn{i}" for i in range(2000)}, timeout_s=60)
        assert not missing, f"{len(missing)} of the first 2000 events never arrived"
        assert {e.data["node"] for e in sink.events} == {head, second}

        # The second node dies while events are being published.
        async def publish_stream() -> None:
            for start in range(2000, 6000, 250):
                await publish_events(kafka_bootstrap, src, _events(start, 250))
                await asyncio.sleep(0.05)

        stream = asyncio.create_task(publish_stream())
        await asyncio.sleep(0.3)
        killed = cluster.kill_node(cluster.worker_dir)
        killed_at = time.monotonic()
        assert any(name.startswith("ray::ServeReplica:eventbus-multinode") for name in killed), (
            killed
        )
        assert any(name.endswith("/raylet") for name in killed), killed
        await stream

        # Every event arrives (at least once): the dead replica's partitions go to the head's.
        missing = await sink.until({f"mn{i}" for i in range(6000)}, timeout_s=90)
        assert not missing, (
            f"{len(missing)} events never arrived after the node died, e.g. {sorted(missing)[:5]}"
        )
        recovered_s = time.monotonic() - killed_at

        # And it keeps serving: events published now arrive too, all run on the head.
        await publish_events(kafka_bootstrap, src, _events(6000, 500))
        last = {f"mn{i}" for i in range(6000, 6500)}
        missing = await sink.until(last, timeout_s=60)
        assert not missing, f"{len(missing)} events published after the failure never arrived"
        assert {e.data["node"] for e in sink.events if e.id in last} == {head}
        if os.environ.get("EVENTBUS_TEST_VERBOSE"):
            from collections import Counter

            print(
                f"\nall events in {recovered_s:.1f} s after the kill; killed:",
                killed,
                "\nevents per node:",
                Counter(e.data["node"][:8] for e in sink.events),
                "\nduplicates:",
                len(sink.events) - len({e.id for e in sink.events}),
            )
    finally:
        await sink.consumer.stop()

    status = _driver(cluster, "status", "multinode")
    assert [p["name"] for p in status["pipelines"]] == ["multinode"]
    # spread: one replica per node, so the lost node's replica waits for a node; it is not
    # started beside the head's (two would fit on its CPU without spread)
    alive = _driver(cluster, "placement", "multinode", "1")["replicas"]
    assert [r["node_id"] for r in alive] == [head], alive
