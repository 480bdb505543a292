"""A Ray cluster over two test hosts (network namespaces, see ``tests/fixtures/netns_hosts.py``):
the head inside host 1 on that host's address, a worker node inside host 2 joining it over the
hosts' bridge, a driver that sees both nodes alive and runs a task on the worker's host.

Each node is Ray's own ``ray start`` run on its host (``hosts_ray.py``), one CPU each.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.netns_hosts import TestHost, TestHosts
from tests.integration.hosts_ray import RAY_PORT, eventbus_cli, ray_on_hosts

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.slow]

# Run on a host: connect to the cluster, print its nodes and where a task pinned to each ran.
_DRIVER = """
import json, sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], log_to_driver=False)
@ray.remote(num_cpus=0)
def where():
    return ray.util.get_node_ip_address()
nodes = [n for n in ray.nodes() if n["Alive"]]
ran = {
    n["NodeManagerAddress"]: ray.get(where.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote())
    for n in nodes
}
labels = {n["NodeManagerAddress"]: n["Labels"].get("host") for n in nodes}
print(json.dumps({"nodes": sorted(n["NodeManagerAddress"] for n in nodes), "ran": ran, "labels": labels}))
"""


@pytest.fixture(scope="module")
def ray_hosts(
    make_hosts: Callable[[int], TestHosts], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TestHosts, dict[str, str], Path]]:
    """Two hosts, a Ray head on the first and a worker node on the second, joined by the
    operator's `eventbus join` run there; the environment a driver needs (the token) and the
    worker's EVENTBUS_HOME."""
    hosts = make_hosts(2)
    home = tmp_path_factory.mktemp("worker-home")
    with ray_on_hosts(hosts[0], [hosts[1]], join_homes=[home]) as env:
        yield hosts, env, home


def _seen(head: TestHost, env: dict[str, str], nodes: int) -> dict[str, Any]:
    """The driver's view once ``nodes`` nodes are alive (or after 90 s: the last view)."""
    deadline = time.monotonic() + 90
    while True:  # a node registers with (or leaves) the GCS shortly after its command returns
        out = head.run([sys.executable, "-c", _DRIVER, f"{head.address}:{RAY_PORT}"], env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        seen: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        if len(seen["nodes"]) == nodes or time.monotonic() > deadline:
            return seen
        time.sleep(1)


def test_head_and_worker_on_two_hosts(
    ray_hosts: tuple[TestHosts, dict[str, str], Path],
) -> None:
    (head, worker), env, home = ray_hosts
    seen = _seen(head, env, 2)
    assert seen["nodes"] == sorted([head.address, worker.address])
    # a task pinned to each node ran on that node's host, at that host's address
    assert seen["ran"] == {head.address: head.address, worker.address: worker.address}
    # `eventbus join --labels host=NAME` labelled the worker node (placement selects by it)
    assert seen["labels"][worker.address] == worker.name, seen
    # the worker node's processes live in host 2's namespace
    assert worker.pids()
    # a second join from the same home is refused; `eventbus down` there stops the node
    again = eventbus_cli(worker, home, "join", f"{head.address}:{RAY_PORT}", "--token-file", "x")
    assert again.returncode == 1 and "already joined" in again.stderr, again.stderr
    down = eventbus_cli(worker, home, "down")
    assert down.returncode == 0 and "stopped: ray node" in down.stdout, down.stdout + down.stderr
    assert _seen(head, env, 1)["nodes"] == [head.address]
    assert not worker.pids()
