"""The Ray head of ``eventbus up``: its environment and flags (what it costs while idle),
started on a free loopback port with token authentication, and stopped (only its processes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eventbus._internal.services import free_port, pid_running, wait_for_port
from eventbus.errors import StackError

__all__ = ["RAY_ENV", "RAY_HEAD_ENV", "RAY_HEAD_FLAGS", "start_ray_head", "stop_ray"]

#: The environment of the Ray processes EventBus starts. Serve replicas run the pipeline's
#: code on their own event loop instead of a second thread's (a cross-thread hop per request
#: less: sync calls ~1.5x the req/s here); the steps themselves run on Serve's thread pool.
RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
}

#: What the Ray head ``up`` starts costs while idle (``benchmarks/idle.py``). Ray's own metrics
#: (OpenCensus export from every worker to the node's agent every few seconds) are off: the
#: embedded stack has no Prometheus scraping Ray, and EventBus's metrics are its own
#: (``/metrics`` on the gateway). Serve's control loop runs every 0.2 s instead of 0.1 s: each
#: round asks the GCS for the cluster's nodes and resources and walks every application, which
#: cost ~3% of a core (Serve's controller + GCS) with two pipelines; a replica start or a scale
#: step waits at most one round more. With no application on Serve it runs every 2 s
#: (``serving/_ray_adapter.py``). The log monitor (it tails every worker's log file to
#: forward lines to drivers, ~0.7% of a core, more with more files) is not started: EventBus's
#: drivers set ``log_to_driver=False`` and the logs stay in the session's log directory.
#: The raylet's memory monitor (the OOM killer) looks once a second instead of every 0.25 s
#: (it reads every worker's memory each round): the raylet 0.52% -> 0.45% of a core, idle; it
#: still kills a runaway worker before the kernel's OOM killer does, a second later at worst.
#: The dashboard agent's reporter collects the node's and every worker's stats for the Ray
#: dashboard's node views every 30 s instead of 5 s (0.35% -> 0.18%): the embedded stack runs
#: no Ray dashboard UI and EventBus reads none of them (failures: the GCS's health checks).
RAY_HEAD_ENV = {
    "RAY_enable_metrics_collection": "0",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.2",
    "RAY_memory_monitor_refresh_ms": "1000",
    "REPORTER_UPDATE_INTERVAL_MS": "30000",
}
RAY_HEAD_FLAGS = ("--include-log-monitor=false",)


def start_ray_head(
    home: Path, num_cpus: int | None, token_path: str, labels: dict[str, str] | None = None
) -> tuple[str, str]:
    port = free_port()
    # Ray's Unix sockets live under its temp dir and their paths may not exceed 107 bytes:
    # keep it short, unique per EVENTBUS_HOME.
    import hashlib
    import tempfile

    digest = hashlib.sha1(str(home.resolve()).encode()).hexdigest()[:10]
    temp_dir = str(Path(tempfile.gettempdir()) / f"eventbus-ray-{digest}")
    argv = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
        *RAY_HEAD_FLAGS,
    ]
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    if labels:
        argv.append("--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
    env = {
        **RAY_HEAD_ENV,
        **os.environ,  # a user's own RAY_* settings win
        **RAY_ENV,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": token_path,
    }
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        msg = f"`ray start --head` failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}\nfix: check `ray status`, or pass --ray-address"
        raise StackError(msg)
    try:
        wait_for_port("127.0.0.1", port, 30)
    except TimeoutError as exc:
        raise StackError(f"the Ray head did not listen on 127.0.0.1:{port}: {exc}") from exc
    return f"127.0.0.1:{port}", temp_dir


def stop_ray(temp_dir: str, token_path: str | None = None) -> None:
    """Stop the Ray processes of the head started with ``temp_dir`` (and only those).

    Ray's workers and agents rewrite their command lines (``ray::ServeReplica...``), so a
    process is also ours when its environment carries our head's token path. They stop in
    ``ray stop``'s order: the raylet, then the workers and agents, the GCS last (a GCS sent
    SIGTERM with its raylet still up waited out the 10 s before its SIGKILL).
    """
    marker = f"RAY_AUTH_TOKEN_PATH={token_path}".encode() if token_path else None
    raylet: list[int] = []
    rest: list[int] = []
    gcs: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            cmd = b" ".join(argv).decode(errors="replace")
            ours = temp_dir in cmd
            if not ours and marker is not None:
                ours = marker in (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if ours:
            exe = argv[0].rsplit(b"/", 1)[-1]
            bucket = raylet if exe == b"raylet" else gcs if exe == b"gcs_server" else rest
            bucket.append(int(proc.name))
    for pids in (raylet, rest, gcs):
        _stop_pids(pids)


def _stop_pids(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(pid_running(p) for p in pids):
            time.sleep(0.1)
