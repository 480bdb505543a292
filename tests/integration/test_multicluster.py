"""Two clusters behind one keeper: deploy to both, spread by weight, fail over, lose nothing.

Two separate local stacks (`eventbus up` in two EVENTBUS_HOMEs: a Ray head, Tansu, Redis and a
gateway each) are registered with a keeper whose registry lives in cluster A's Redis. One
pipeline (http + grpc sources, a Kafka sink, no steps) is deployed to both with `eventbus
keeper deploy`. An AsyncClient publishes events with unique ids at weights 50/50; cluster B's
gateway is killed (SIGKILL) mid-run. Every id the client saw accepted must reach the sink of
the cluster that accepted it; the client's failover time is printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import eventbus
from eventbus._client._router import ClientStats
from eventbus.errors import IngressError
from tests.integration.kafka_helpers import collect

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parents[2]
#: the client's per-request timeout: a failover that waited it out shows as one this long
CLIENT_TIMEOUT_S = 30.0
N_EVENTS = 3000
BATCH = 5
CONCURRENCY = 8
KILL_AFTER = 1000  # accepted events before cluster B's gateway is killed

PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: mc-orders}
spec:
  sources:
    - http: {type: order.created, source: /it/multicluster}
    - grpc: {mode: sync}
  sink: {kafka: {topic: mc-orders-out, create: {partitions: 4}}}
  serving: {replicas: 1, batch: {max_size: 1000, linger_ms: 2}}
"""


def eb(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_ADDRESS", "RAY_AUTH", "EVENTBUS_"))
    }
    env.update(
        {"EVENTBUS_HOME": str(home), "COLUMNS": "200", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    )
    return subprocess.run(
        [sys.executable, "-m", "eventbus.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def wait_serving(gateway: str, pipeline: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if pipeline in httpx.get(f"{gateway}/healthz", timeout=2).json()["pipelines"]:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{gateway} does not serve {pipeline}"
        time.sleep(0.2)


async def publish_and_kill(
    keeper_redis: str, gateway_pid: int
) -> tuple[dict[str, str], ClientStats, float]:
    """Publish N_EVENTS in batches; SIGKILL the gateway after KILL_AFTER were accepted.

    Returns accepted id -> cluster, the client's stats and the kill's time.
    """
    accepted: dict[str, str] = {}
    refused: list[str] = []
    killed_at = 0.0
    kill_now = asyncio.Event()
    queue: asyncio.Queue[list[eventbus.CloudEvent]] = asyncio.Queue()
    for start in range(0, N_EVENTS, BATCH):
        queue.put_nowait(
            [
                eventbus.CloudEvent.create(
                    type="order.created", source="/it", id=f"mc-{i}", data={"i": i}
                )
                for i in range(start, start + BATCH)
            ]
        )
    client = eventbus.AsyncClient(
        keeper_redis, prefer_local=False, seed=11, timeout_s=CLIENT_TIMEOUT_S, backoff_s=1.0
    )

    async def worker() -> None:
        while not queue.empty():
            batch = queue.get_nowait()
            try:
                got = await client.publish("mc-orders", batch)
            except IngressError as exc:  # nothing accepted: fine, but counted
                refused.append(str(exc))
                continue
            accepted.update(dict.fromkeys(got, got.cluster))
            if len(accepted) >= KILL_AFTER:
                kill_now.set()

    async def killer() -> None:
        nonlocal killed_at
        await kill_now.wait()
        os.kill(gateway_pid, signal.SIGKILL)
        killed_at = time.monotonic()

    kill_task = asyncio.ensure_future(killer())
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    await kill_task
    stats = client.stats()
    await client.close()
    assert not refused, refused[:3]
    return accepted, stats, killed_at


def test_two_clusters_fail_over_without_losing_an_accepted_event(tmp_path: Path) -> None:
    homes = {"a": tmp_path / "a", "b": tmp_path / "b"}
    t0 = time.monotonic()
    try:
        # Both stacks start at once. Ports are left to `up` (free ones when taken, picked once
        # Ray runs): gRPC servers bind with SO_REUSEPORT, so a free port picked here and bound
        # later could be shared with a Ray agent started meanwhile, which would take some
        # connections. B asks for ports outside the ephemeral range (Ray's agents pick theirs
        # there), so the two `up`s never race for 8080/50051.
        ports = {"a": [], "b": ["--http-port", "8081", "--grpc-port", "20051"]}
        with ThreadPoolExecutor(len(homes)) as pool:
            ups = {
                n: pool.submit(eb, h, "up", "--num-cpus", "1", *ports[n]) for n, h in homes.items()
            }
        for up in ups.values():
            assert up.result().returncode == 0, up.result().stdout + up.result().stderr
        stacks = {n: json.loads((h / "stack.json").read_text()) for n, h in homes.items()}
        assert stacks["a"]["ray_address"] != stacks["b"]["ray_address"]
        keeper = stacks["a"]["redis_url"]
        for name, home in homes.items():
            add = eb(
                home,
                "keeper",
                "add",
                name,
                "--home",
                str(home),
                "--weight",
                "50",
                "--keeper-redis",
                keeper,
            )
            assert add.returncode == 0 and f"added cluster {name}" in add.stdout, add.stderr
        listing = eb(homes["a"], "keeper", "list", "--json", "--keeper-redis", keeper)
        registry = json.loads(listing.stdout)
        assert [(c["name"], c["gateway"], c["weight"]) for c in registry["clusters"]] == [
            (n, stacks[n]["gateway_http"], 50) for n in homes
        ]
        pipeline = tmp_path / "mc-orders.yaml"
        pipeline.write_text(PIPELINE)
        dep = eb(
            homes["a"], "keeper", "deploy", str(pipeline), "--keeper-redis", keeper, timeout=400
        )
        assert dep.returncode == 0, dep.stdout + dep.stderr
        assert dep.stdout.count("deployed mc-orders version 1") == 2, dep.stdout
        for st in stacks.values():
            wait_serving(st["gateway_http"], "mc-orders")
        t_ready = time.monotonic()

        accepted, stats, killed_at = asyncio.run(
            publish_and_kill(keeper, stacks["b"]["owned"]["gateway"]["pid"])
        )
        t_published = time.monotonic()
        assert len(accepted) == N_EVENTS
        by_cluster = {n: {i for i, c in accepted.items() if c == n} for n in homes}
        # Both took traffic at 50/50 before the kill; B took none after it.
        assert len(by_cluster["b"]) >= 200 and len(by_cluster["a"]) > len(by_cluster["b"]), {
            n: len(v) for n, v in by_cluster.items()
        }
        assert stats.failovers >= 1 and stats.clusters["b"].failures >= 1, stats
        failover_s = stats.failover_s[0]

        # gRPC too: B's gRPC died with its gateway; the client goes to A.
        with eventbus.Client(
            keeper, transport="grpc", prefer_local=False, seed=5, timeout_s=10
        ) as grpc_client:
            grpc_ids = [
                grpc_client.publish("mc-orders", {"n": i}, type="order.created", source="/it/grpc")
                for i in range(20)
            ]
            assert {g.cluster for g in grpc_ids} == {"a"}
            [out] = grpc_client.invoke(
                "mc-orders",
                eventbus.CloudEvent.create(
                    type="order.created", source="/it", id="sync-1", data={"n": 1}
                ),
            )
            assert (out.id, out.data) == ("sync-1", {"n": 1})
            grpc_failures_a = grpc_client.stats().clusters["a"].failures
        by_cluster["a"] |= {i for g in grpc_ids for i in g}

        # Blue-green: all traffic to A by weight, with B still registered.
        assert (
            eb(homes["a"], "keeper", "weight", "b", "0", "--keeper-redis", keeper).returncode == 0
        )
        with eventbus.Client(keeper, prefer_local=False) as http_client:
            assert {http_client.publish("mc-orders", {"n": i}).cluster for i in range(20)} == {"a"}

        # Every accepted id is at the sink of the cluster that accepted it.
        sinks: dict[str, set[str]] = {}
        for name, st in stacks.items():
            events = asyncio.run(
                collect(
                    st["kafka_bootstrap"],
                    "mc-orders-out",
                    len(by_cluster[name]) + (20 if name == "a" else 0),
                    timeout_s=90,
                )
            )
            sinks[name] = {e.id for e in events}
        t_checked = time.monotonic()
        for name in homes:
            missing = by_cluster[name] - sinks[name]
            assert not missing, (
                f"{len(missing)} ids accepted by {name} are not at its sink, e.g. {sorted(missing)[:5]}"
            )
        duplicates = len(sinks["a"] & sinks["b"])
        print(
            f"\nmulticluster: {N_EVENTS} events in {N_EVENTS // BATCH} requests; accepted by a={len(by_cluster['a'] - {i for g in grpc_ids for i in g})} "
            f"b={len(by_cluster['b'])}; B's gateway killed after {KILL_AFTER} accepted; failovers={stats.failovers}; "
            f"failover time {failover_s * 1000:.1f} ms (all: {[round(s * 1000, 1) for s in stats.failover_s]}); "
            f"ids at both sinks: {duplicates}; gRPC failures on a: {grpc_failures_a}; stacks up + deploy {t_ready - t0:.1f} s, publish {t_published - t_ready:.1f} s, "
            f"kill at +{killed_at - t_ready:.1f} s, sinks checked {t_checked - t_published:.1f} s after"
        )
        # a refused connection fails over at once (milliseconds); waiting out the request's
        # timeout instead would take CLIENT_TIMEOUT_S
        assert failover_s < CLIENT_TIMEOUT_S / 2
    finally:
        with ThreadPoolExecutor(len(homes)) as pool:
            downs = dict(zip(homes, pool.map(lambda h: eb(h, "down"), homes.values()), strict=True))
    for n, d in downs.items():
        assert d.returncode == 0, (n, d.stderr)
        assert not (homes[n] / "stack.json").exists()
