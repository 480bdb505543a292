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

import pytest

from tests.fixtures.netns_hosts import TestHosts
from tests.integration.hosts_ray import RAY_PORT, ray_on_hosts

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
print(json.dumps({"nodes": sorted(n["NodeManagerAddress"] for n in nodes), "ran": ran}))
"""


@pytest.fixture(scope="module")
def ray_hosts(
    make_hosts: Callable[[int], TestHosts],
) -> Iterator[tuple[TestHosts, dict[str, str]]]:
    """Two hosts, a Ray head on the first and a worker node on the second; the environment a
    driver needs (the token)."""
    hosts = make_hosts(2)
    with ray_on_hosts(hosts[0], [hosts[1]]) as env:
        yield hosts, env


def test_head_and_worker_on_two_hosts(ray_hosts: tuple[TestHosts, dict[str, str]]) -> None:
    (head, worker), env = ray_hosts
    deadline = time.monotonic() + 90
    while True:  # the worker registers with the GCS shortly after its `ray start` returns
        out = head.run([sys.executable, "-c", _DRIVER, f"{head.address}:{RAY_PORT}"], env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        if len(seen["nodes"]) == 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert seen["nodes"] == sorted([head.address, worker.address])
    # a task pinned to each node ran on that node's host, at that host's address
    assert seen["ran"] == {head.address: head.address, worker.address: worker.address}
    # the worker node's processes live in host 2's namespace
    assert worker.pids()
