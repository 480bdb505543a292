"""A whole stack on production-shaped Redis: deploy, a join with dedupe, a replica kill -9.

On a three-master Redis Cluster (``redis+cluster://``) and on a Redis serving TLS only with an
ACL user (``rediss://eventbus:...@...?ssl_ca_certs=...``, the ``default`` user off). The
state-level checks (join scripts, dedupe, model registry, the control plane's transaction) are
in ``test_redis_cluster.py`` and ``test_redis_security.py``. Here ``eventbus up --redis-url
...`` starts its own Ray head, controller and gateway (in their own ``EVENTBUS_HOME``) on that
Redis and the session's broker; ``eventbus deploy`` deploys a join of orders and payments with
``delivery.dedupe``; the replica is killed with SIGKILL mid-run; every pair must reach the sink
exactly once, and ``eventbus get`` must read the pipeline back. The two stacks run at the
same time (one test, a thread each), each on its own Redis, topics and pipeline.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.kafka_helpers import collect
from tests.integration.test_join import check_pairs, doc, events, produce

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parents[2]
PAIRS = 3000


def eb(home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
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


def replica_pids(app: str) -> list[int]:
    """The pids of the Serve replicas of ``app`` (their process title names the app)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if f"ServeReplica:{app}:" in cmdline:
            pids.append(int(entry.name))
    return pids


def wait_for(cond: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return got


def stack_join_dedupe_and_replica_kill(
    home: Path, redis_url: str, kafka_bootstrap: str, topic_factory: Any
) -> str:
    """``eventbus up`` on ``redis_url``, deploy the join, kill its replica mid-run, check every
    pair once, ``eventbus get``; ``down`` at the end. Returns the phases' times."""
    t0 = time.monotonic()
    up = eb(
        home,
        "up",
        "--num-cpus",
        "1",
        "--redis-url",
        redis_url,
        "--kafka-bootstrap",
        kafka_bootstrap,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        t_up = time.monotonic()
        orders_t, payments_t = (
            topic_factory("orders", partitions=2),
            topic_factory("payments", partitions=2),
        )
        sink, dlq = topic_factory("paid", partitions=2), topic_factory("dlq")
        name = f"stack-join-{uuid.uuid4().hex[:6]}"
        spec = home.parent / f"{name}.yaml"
        spec.write_text(yaml.safe_dump(doc(name, orders_t, payments_t, sink, dlq)))
        dep = eb(home, "deploy", str(spec))
        assert dep.returncode == 0 and f"deployed {name} version 1" in dep.stdout, (
            dep.stdout + dep.stderr
        )
        t_deployed = time.monotonic()
        [victim] = wait_for(lambda: replica_pids(f"eventbus-{name}"), 60, "the replica")

        orders, payments = events(PAIRS, seed=7)
        progress = [0]

        async def kill_midway() -> None:
            while progress[0] < PAIRS * 0.8:  # 40% of the events produced
                await asyncio.sleep(0.05)
            os.kill(victim, signal.SIGKILL)

        async def run() -> list[Any]:
            await asyncio.gather(
                produce(kafka_bootstrap, orders_t, orders, progress),
                produce(kafka_bootstrap, payments_t, payments, progress),
                kill_midway(),
            )
            return await collect(kafka_bootstrap, sink, PAIRS, timeout_s=180)

        out = asyncio.run(run())
        check_pairs(out, PAIRS)
        t_checked = time.monotonic()
        assert wait_for(
            lambda: [p for p in replica_pids(f"eventbus-{name}") if p != victim],
            60,
            "a new replica",
        )
        status = eb(home, "get", name)
        assert status.returncode == 0 and name in status.stdout, status.stdout + status.stderr
    finally:
        down = eb(home, "down")
        assert down.returncode == 0, down.stdout + down.stderr
    return (
        f"up {t_up - t0:.1f} s, deploy {t_deployed - t_up:.1f} s, "
        f"{PAIRS} pairs {t_checked - t_deployed:.1f} s, down at {time.monotonic() - t0:.1f} s"
    )


def test_stack_join_dedupe_and_replica_kill(
    tmp_path: Path,
    redis_cluster: Any,
    redis_tls: Any,
    kafka_bootstrap: str,
    topic_factory: Any,
) -> None:
    """Both stacks at once (each its own Ray head, controller and gateway): the suite's time
    budget pays for one stack's start-up, not two in a row."""
    urls = {"cluster": str(redis_cluster.url), "tls-acl": str(redis_tls.url())}
    with ThreadPoolExecutor(len(urls)) as pool:
        runs = {
            kind: pool.submit(
                stack_join_dedupe_and_replica_kill,
                tmp_path / kind / "home",
                url,
                kafka_bootstrap,
                topic_factory,
            )
            for kind, url in urls.items()
        }
        failed = []
        for kind, fut in runs.items():
            try:
                print(f"redis stack on {kind}: {fut.result()}")
            except BaseException as exc:
                failed.append(f"on {kind}: {type(exc).__name__}: {exc}")
    assert not failed, "\n".join(failed)
