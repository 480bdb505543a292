"""A Ray cluster on test hosts (``tests/fixtures/netns_hosts.py``): the head on one host, worker
nodes on others, each Ray's own ``ray start`` run inside its host on that host's address.

The environment is the one ``eventbus up`` gives its head (``RAY_HEAD_ENV``, ``RAY_ENV``, token
authentication) except ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``: 0 keeps a local stack on loopback
and refuses to join nodes; the hosts have their own addresses and join. Each node has its own
temp dir (their Unix sockets share the file system) and a 100 MB object store. Nodes are
stopped by killing their hosts' processes (``TestHost.kill_all``), never by ``ray stop`` (which
stops every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from eventbus._internal.ray_head import RAY_ENV, RAY_HEAD_ENV, RAY_HEAD_FLAGS
from tests.fixtures.netns_hosts import TestHost

__all__ = ["RAY_PORT", "eventbus_cli", "ray_on_hosts"]

RAY = str(Path(sys.executable).parent / "ray")
RAY_PORT = 6379  # each host has its own ports: the default is free there


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


def _ray_start(host: TestHost, env: dict[str, str], temp_dir: Path, *args: str) -> None:
    argv = [
        RAY,
        "start",
        f"--node-ip-address={host.address}",
        "--object-store-memory=100000000",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
        *args,
    ]
    proc = host.run(argv, env=env)
    if proc.returncode != 0:
        msg = f"`ray start {' '.join(args)}` on {host} failed ({proc.returncode}): {proc.stderr[-3000:]}"
        raise RuntimeError(msg)


def eventbus_cli(host: TestHost, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``eventbus ARGS`` run on ``host`` with its own EVENTBUS_HOME, as an operator there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "EVENTBUS_"))}
    env.update(EVENTBUS_HOME=str(home), COLUMNS="200")
    return host.run([sys.executable, "-m", "eventbus.cli", *args], env=env)


def eventbus_join(host: TestHost, home: Path, head: str, token: Path, cpus: int) -> None:
    """``eventbus join HEAD --token-file ... --node-ip-address HOST`` on ``host``."""
    done = eventbus_cli(
        host, home, "join", head, "--token-file", str(token),
        "--node-ip-address", host.address, "--num-cpus", str(cpus), "--labels", f"host={host.name}",
    )  # fmt: skip
    if done.returncode != 0:
        msg = f"`eventbus join` on {host} failed ({done.returncode}): {done.stdout}{done.stderr[-3000:]}"
        raise RuntimeError(msg)


@contextlib.contextmanager
def ray_on_hosts(
    head: TestHost,
    workers: Sequence[TestHost],
    head_cpus: int = 1,
    worker_cpus: int = 1,
    join_homes: Sequence[Path] | None = None,
) -> Iterator[dict[str, str]]:
    """Run a Ray head on ``head`` and a worker node on each of ``workers``; yield the
    environment a driver needs (the token). The head's address is ``head.address:RAY_PORT``.
    With ``join_homes`` (one EVENTBUS_HOME per worker) each worker node is started as an
    operator does, with ``eventbus join`` run on its host. On exit (or a failed start) every
    process of these hosts is killed."""
    # Ray's socket paths must stay under 107 bytes: short temp dirs
    root = Path(tempfile.mkdtemp(prefix="ebhray-", dir="/tmp"))
    token = root / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = _env(token)
    try:
        _ray_start(
            head,
            env,
            root / "head",
            "--head",
            f"--port={RAY_PORT}",
            f"--num-cpus={head_cpus}",
            "--include-dashboard=false",
            *RAY_HEAD_FLAGS,
        )
        for i, host in enumerate(workers):
            if join_homes is not None:
                eventbus_join(host, join_homes[i], f"{head.address}:{RAY_PORT}", token, worker_cpus)
                continue
            address = f"--address={head.address}:{RAY_PORT}"
            _ray_start(host, env, root / f"w{i}", address, f"--num-cpus={worker_cpus}")
        yield env
    finally:
        for host in [*reversed(workers), head]:
            host.kill_all()
        shutil.rmtree(root, ignore_errors=True)
