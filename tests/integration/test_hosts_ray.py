"""A Ray cluster over two test hosts (network namespaces, see ``tests/fixtures/netns_hosts.py``):
the head inside host 1 on that host's address, a worker node inside host 2 joining it over the
hosts' bridge, a driver that sees both nodes alive and runs a task on the worker's host.

Each node is Ray's own ``ray start`` run on its host, with the environment ``eventbus up``
gives its head (``RAY_HEAD_ENV``, ``RAY_ENV``) except ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``: 0
keeps a local stack on loopback and refuses to join nodes; the hosts have their own addresses
and join. Each node has its own temp dir (their Unix sockets share the file system), one CPU
and a 100 MB object store. Nodes are stopped by killing their host's processes, never by
``ray stop`` (which stops every Ray on the machine).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eventbus._internal.ray_head import RAY_ENV, RAY_HEAD_ENV, RAY_HEAD_FLAGS
from tests.fixtures.netns_hosts import TestHost, TestHosts

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.slow]

RAY = str(Path(sys.executable).parent / "ray")
PORT = 6379  # each host has its own ports: the default is free there

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


def _env(token: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    return {
        **RAY_HEAD_ENV,
        **env,
        **RAY_ENV,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
        "RAY_AUTH_MODE": "token",  # as `eventbus up` runs its head: every node shares the token
        "RAY_AUTH_TOKEN_PATH": str(token),
    }


def _ray_start(host: TestHost, temp_dir: Path, *args: str) -> None:
    proc = host.run(
        [
            RAY,
            "start",
            f"--node-ip-address={host.address}",
            "--num-cpus=1",
            "--object-store-memory=100000000",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
            *args,
        ],
        env=_env(temp_dir.parent / "token"),
    )
    if proc.returncode != 0:
        msg = f"`ray start {' '.join(args)}` on {host} failed ({proc.returncode}): {proc.stderr[-3000:]}"
        raise RuntimeError(msg)


@pytest.fixture(scope="module")
def ray_hosts(
    make_hosts: Callable[[int], TestHosts],
) -> Iterator[tuple[TestHosts, dict[str, str]]]:
    """Two hosts, a Ray head on the first and a worker node on the second; the environment a
    driver needs (the token)."""
    hosts = make_hosts(2)
    # Ray's socket paths must stay under 107 bytes: short temp dirs
    root = Path(tempfile.mkdtemp(prefix="ebhray-", dir="/tmp"))
    token = root / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    try:
        _ray_start(
            hosts[0],
            root / "h1",
            "--head",
            f"--port={PORT}",
            "--include-dashboard=false",
            *RAY_HEAD_FLAGS,
        )
        _ray_start(hosts[1], root / "h2", f"--address={hosts[0].address}:{PORT}")
        yield hosts, _env(token)
    finally:
        for host in reversed(hosts):
            host.kill_all()
        shutil.rmtree(root, ignore_errors=True)


def test_head_and_worker_on_two_hosts(ray_hosts: tuple[TestHosts, dict[str, str]]) -> None:
    (head, worker), env = ray_hosts
    deadline = time.monotonic() + 90
    while True:  # the worker registers with the GCS shortly after its `ray start` returns
        out = head.run([sys.executable, "-c", _DRIVER, f"{head.address}:{PORT}"], env=env)
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
