"""An EventBus pipeline across test hosts (network namespaces, ``tests/fixtures/netns_hosts.py``):
a three-broker Apache Kafka with node i on host i, Redis and the Ray head on host 1 (no CPU:
nothing of the pipeline's runs there), a Ray worker node on host 2 (one CPU). The pipeline's one
replica therefore runs on host 2 and reads from and writes to the brokers over the hosts'
network. Host 2's link is cut for 10 s (its replica and its broker cut off, still running)
while events are published from the root namespace; after the heal every event arrives at the
sink, stamped by the replica on host 2 (at least once: every id is there).

Everything that talks to this Ray cluster runs in ``multinode_driver.py`` on host 1 (the pytest
process may hold the session's own Ray).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from eventbus import CloudEvent
from eventbus._internal.kafka_broker import KafkaCluster, start_kafka_cluster
from eventbus._internal.services import wait_for_port
from eventbus.eventing._publish import publish_events
from tests.fixtures.netns_hosts import TestHosts
from tests.integration.hosts_ray import RAY_PORT, ray_on_hosts
from tests.integration.kafka3 import create_topics, placement
from tests.integration.test_multinode import _Sink

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.kafka_only,
    pytest.mark.ray,
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parents[2]
CUT_S = 10.0
REDIS_PORT = 6380


@dataclass
class HostStack:
    hosts: TestHosts
    kafka: KafkaCluster
    redis_url: str
    ray_address: str
    env: dict[str, str]

    def driver(self, *args: str) -> dict[str, Any]:
        """One step of ``multinode_driver.py`` run on host 1; its last JSON line."""
        argv = [sys.executable, "-m", "tests.integration.multinode_driver", args[0]]
        argv += [self.ray_address, *args[1:]]
        proc = self.hosts[0].run(argv, env=self.env, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        return json.loads(lines[-1])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def stack(
    make_hosts: Callable[[int], TestHosts], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HostStack]:
    hosts = make_hosts(3)
    tmp = tmp_path_factory.mktemp("hosts-stack")
    kafka = start_kafka_cluster(
        home=tmp / "kafka",
        n_nodes=3,
        heap_mb=256,
        hosts=[h.address for h in hosts],
        launchers=[h.launcher for h in hosts],
    )
    try:
        redis = hosts[0].popen(
            ["redis-server", "--bind", hosts[0].address, "--port", str(REDIS_PORT), "--save", "",
             "--appendonly", "no", "--dir", str(tmp),
             "--protected-mode", "no"],  # reachable from the test hosts only
            log=tmp / "redis.log",
        )  # fmt: skip
        wait_for_port(hosts[0].address, REDIS_PORT, 30)
        with ray_on_hosts(hosts[0], [hosts[1]], head_cpus=0, worker_cpus=1) as env:
            yield HostStack(
                hosts,
                kafka,
                f"redis://{hosts[0].address}:{REDIS_PORT}/0",
                f"{hosts[0].address}:{RAY_PORT}",
                env,
            )
        redis.wait(10)  # killed with host 1's processes
    finally:
        kafka.stop(5)


def _events(start: int, n: int) -> list[CloudEvent]:
    return [
        CloudEvent.create(
            type="mn.created", source="/hosts", id=f"h{i}", data={"n": i}, partitionkey=str(i)
        )
        for i in range(start, start + n)
    ]


async def test_replica_on_a_cut_host_loses_nothing(stack: HostStack, tmp_path: Path) -> None:
    bootstrap = stack.kafka.bootstrap
    await create_topics(
        bootstrap, {"hp-in": placement({0: 1, 1: 3}), "hp-out": placement({0: 3, 1: 1})}
    )
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "hosts"},
        "spec": {
            "sources": [{"kafka": {"topic": "hp-in"}}],
            "steps": [{"id": "stamp", "function": "tests.integration.multinode_driver:stamp_node"}],
            "sink": {"kafka": {"topic": "hp-out"}},
            "serving": {"replicas": 1, "num_cpus": 1, "batch": {"max_size": 200, "linger_ms": 5}},
        },
    }
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    deployed = stack.driver("deploy", bootstrap, stack.redis_url, str(path), "1")
    nodes = {n["node_id"]: n for n in deployed["nodes"]}
    [worker] = [n for n, info in nodes.items() if not info["head"]]
    assert [r["node_id"] for r in deployed["replicas"]] == [worker], deployed

    sink = _Sink(bootstrap, "hp-out")
    await sink.consumer.start()
    try:
        await publish_events(bootstrap, "hp-in", _events(0, 200))
        missing = await sink.until({f"h{i}" for i in range(200)}, timeout_s=90)
        assert not missing, f"{len(missing)} of the first 200 events never arrived"

        stack.hosts[1].cut()
        cut_at = time.monotonic()
        try:
            for start in range(200, 400, 50):  # published while host 2 is cut off
                await publish_events(bootstrap, "hp-in", _events(start, 50))
            # the rest of the cut: nothing published meanwhile gets through the cut replica
            during = {f"h{i}" for i in range(200, 400)}
            left = await sink.until(during, max(0.0, CUT_S - (time.monotonic() - cut_at)))
            assert left == during, f"{len(during - left)} events processed while cut off"
        finally:
            stack.hosts[1].heal()
        healed_at = time.monotonic()
        missing = await sink.until({f"h{i}" for i in range(400)}, timeout_s=180)
        assert not missing, f"{len(missing)} events never arrived after the heal"
        print(f"\nall 400 events {time.monotonic() - healed_at:.1f} s after the heal")
        # every event ran in the replica on host 2, the worker node
        assert {e.data["node"] for e in sink.events} == {worker}
    finally:
        await sink.consumer.stop()
