"""The local stack of ``eventbus up``: Ray, the Kafka-protocol broker and Redis.

Each part is either started here (a local process on a free loopback port, recorded in
``<home>/stack.json``) or taken as an existing address, in which case nothing of ours runs
for it. ``down`` stops only what ``up`` started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eventbus._internal.ports import pick_port
from eventbus._internal.redis_client import check_redis, redact
from eventbus._internal.services import (
    ServiceProcess,
    free_port,
    kafka_metadata_ready,
    start_redis,
    start_tansu,
    wait_for_port,
)
from eventbus.errors import StackError

__all__ = ["Stack", "load_stack", "redact", "stack_down", "stack_status", "stack_up"]

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
#: (``serving/_serve_pace.py``). The log monitor (it tails every worker's log file to
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


@dataclass
class Stack:
    """Addresses of the stack's parts, and the pids of the parts this stack started.

    Attributes:
        ray_address: ``host:port`` of the Ray cluster's GCS.
        kafka_bootstrap: Kafka bootstrap servers.
        redis_url: ``redis://host:port/db``.
        owned: part name -> {"pid": ..., "log": ...} for parts started by ``up``.
        ray_auth_token_path: the token file of a Ray head ``up`` started.
        gateway_http: ``http://host:port`` of the gateway ``up`` started.
        gateway_grpc: ``host:port`` of its gRPC service.
        kafka_client: the Kafka connection settings (``KafkaClientConfig`` as a dict: TLS
            files and secret references, never secrets); None: plaintext.
        moved: one line per part ``up`` could not give the port it wanted (taken), naming it.
    """

    ray_address: str
    kafka_bootstrap: str
    redis_url: str
    owned: dict[str, dict[str, Any]] = field(default_factory=dict)
    ray_auth_token_path: str | None = None
    gateway_http: str | None = None
    gateway_grpc: str | None = None
    kafka_client: dict[str, Any] | None = None
    moved: list[str] = field(default_factory=list)

    def ray_env(self) -> dict[str, str]:
        """Environment a Ray client needs for this cluster (its auth token, if we made one)."""
        env = dict(RAY_ENV)
        if self.ray_auth_token_path:
            env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.ray_auth_token_path})
        return env


def _state_file(home: Path) -> Path:
    return home / "stack.json"


def load_stack(home: Path) -> Stack | None:
    """The stack recorded in ``home``, or None."""
    path = _state_file(home)
    if not path.exists():
        return None
    return Stack(**json.loads(path.read_text()))


def stack_up(
    home: Path,
    *,
    ray_address: str | None = None,
    kafka_bootstrap: str | None = None,
    redis_url: str | None = None,
    num_cpus: int | None = None,
    gateway: bool = True,
    http_port: int | None = None,
    grpc_port: int | None = None,
    redis_maxmemory: str = "1gb",
    kafka_client: dict[str, Any] | None = None,
    broker: str = "tansu",
) -> Stack:
    """Start (or adopt) the stack and record it in ``home``.

    Args:
        home: the state directory (logs, ``stack.json``).
        ray_address: an existing Ray cluster; None starts a local head node.
        kafka_bootstrap: an existing Kafka cluster; None starts the Tansu broker.
        redis_url: an existing Redis (``redis://``, ``rediss://`` with TLS, ``USER:PASSWORD@``
            an ACL user, ``redis+cluster://`` a Redis Cluster: see
            :mod:`eventbus._internal.redis_client`), pinged first; None starts a local
            redis-server.
        num_cpus: CPUs the local Ray head offers (default: all).
        gateway: start the HTTP/gRPC gateway too.
        http_port: the gateway's HTTP port; None: the one it had at the last ``up``, else
            8080 (see :mod:`eventbus._internal.ports`); a free one when taken (recorded in
            ``Stack.moved``).
        grpc_port: the gateway's gRPC port, likewise (default 50051).
        redis_maxmemory: the memory limit of a Redis started here (``noeviction``: at the
            limit writes fail loudly; nothing is evicted). A Redis started here also gets a password
            (``<home>/redis_password``, mode 0600), carried in the Redis URL handed out.
        kafka_client: the Kafka connection settings (a ``KafkaClientConfig`` as a dict), for
            an existing cluster; recorded, and handed to the gateway and the controller.
        broker: the broker started when ``kafka_bootstrap`` is None: ``tansu`` (memory
            storage) or ``kafka`` (Apache Kafka, KRaft, storage in ``home/kafka``: records
            survive ``down`` and ``up``).

    Raises:
        StackError: a part failed to start (or the given Redis refused us: the message names
            why and the fix); the parts this call started are stopped again.
    """
    existing = load_stack(home)
    if existing is not None and stack_status(home)["healthy"]:
        return existing
    home.mkdir(parents=True, exist_ok=True)
    logs = home / "logs"
    logs.mkdir(exist_ok=True)
    owned: dict[str, dict[str, Any]] = {}
    started: list[ServiceProcess] = []
    moved: list[str] = []
    try:
        if kafka_bootstrap is None and broker == "kafka":
            from eventbus._internal.kafka_broker import start_kafka

            cluster = start_kafka(home=home / "kafka", port=_kafka_port(home))
            node = cluster.nodes[0]
            assert node.proc is not None
            started.append(node.proc)
            kafka_bootstrap = cluster.bootstrap
            owned["kafka"] = {"pid": node.pid, "log": str(node.proc.log_path), "kind": "kafka"}
        elif kafka_bootstrap is None:
            port, note = pick_port(home, "kafka")
            moved += [note] if note else []
            svc = start_tansu(log_dir=logs, detach=True, port=port)
            started.append(svc)
            kafka_bootstrap = svc.address
            owned["kafka"] = {"pid": svc.pid, "log": str(svc.log_path), "kind": "tansu"}
        if redis_url is not None:
            check_redis(redis_url)
        else:
            port, note = pick_port(home, "redis")
            moved += [note] if note else []
            svc = start_redis(
                port=port,
                data_dir=home / "redis",
                detach=True,
                appendonly=True,
                password=_redis_password(home),
                maxmemory=redis_maxmemory,
            )
            started.append(svc)
            redis_url = svc.address
            owned["redis"] = {"pid": svc.pid, "log": str(svc.log_path)}
        token_path: str | None = None
        if ray_address is None:
            token_path = _make_token(home)
            ray_address, ray_dir = _start_ray_head(home, num_cpus, token_path)
            owned["ray"] = {"temp_dir": ray_dir}
        stack = Stack(
            ray_address=ray_address,
            kafka_bootstrap=kafka_bootstrap,
            redis_url=redis_url,
            owned=owned,
            ray_auth_token_path=token_path,
            kafka_client=kafka_client,
            moved=moved,
        )
        if gateway:
            http_port, note = pick_port(home, "gateway HTTP", http_port)
            moved += [note] if note else []
            grpc_port, note = pick_port(home, "gateway gRPC", grpc_port)
            moved += [note] if note else []
            gw, stack.gateway_http, stack.gateway_grpc = start_gateway(
                stack, logs, http_port, grpc_port
            )
            started.append(gw)
            owned["gateway"] = {"pid": gw.pid, "log": str(gw.log_path)}
    except BaseException:
        for svc in started:
            svc.stop()
        if "ray" in owned:
            _stop_ray(owned["ray"]["temp_dir"], token_path)
        raise
    # 0600: the Redis URL in it carries the embedded Redis's password
    write_private(_state_file(home), json.dumps(asdict(stack), indent=2))
    return stack


def _kafka_port(home: Path) -> int:
    """The client port of the Apache Kafka ``up`` starts: the one it had before when free
    (clients configured with the old address keep working), else a free one."""
    path = home / "kafka" / "client_port"
    port = 0
    if path.exists():
        port = _port_or_free(int(path.read_text().strip() or 0) or free_port())
    else:
        port = free_port()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(port))
    return port


def _port_or_free(port: int) -> int:
    from eventbus._internal.ports import port_free

    return port if port_free(port) else free_port()


def start_gateway(
    stack: Stack, logs: Path, http_port: int, grpc_port: int
) -> tuple[ServiceProcess, str, str]:
    """Start ``eventbus gateway`` as a detached process on loopback; wait until it answers.

    Returns:
        The process, its HTTP base URL and its gRPC address.

    Raises:
        StackError: it did not start (its log's tail included).
    """
    import urllib.request

    from eventbus._internal.services import _launch, _tail

    # the ports were picked free (pick_port): a race lost here fails loudly with the log
    argv = [
        sys.executable,
        "-m",
        "eventbus.cli",
        "gateway",
        "--host",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--ray-address",
        stack.ray_address,
        "--kafka-bootstrap",
        stack.kafka_bootstrap,
        "--admin-token-file",
        _make_admin_token(logs.parent),  # logs is $EVENTBUS_HOME/logs
    ]
    saved = dict(os.environ)
    os.environ.update(stack.ray_env())
    # in the environment, not on the command line (``ps``): the URL carries Redis's password
    os.environ["EVENTBUS_REDIS_URL"] = stack.redis_url
    if stack.kafka_client:
        kafka_config = logs.parent / "kafka_client.json"
        write_private(kafka_config, json.dumps(stack.kafka_client))
        os.environ["EVENTBUS_KAFKA_CONFIG"] = str(kafka_config)
    try:
        svc = _launch(
            "gateway", argv, logs / "gateway.log", f"http://127.0.0.1:{http_port}", detach=True
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if not svc.alive() or time.monotonic() > deadline:
            svc.stop()
            msg = f"the gateway did not start on 127.0.0.1:{http_port}; its log says:\n{_tail(svc.log_path)}"
            raise StackError(msg)
        time.sleep(0.1)
    return svc, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"


def write_private(path: Path, text: str, *, replace: bool = True) -> bool:
    """Write ``text`` to ``path`` readable by us only, atomically: a temporary file created
    with mode 0600 (never briefly readable by others, whatever the umask), then renamed.

    Args:
        path: the file.
        text: its content.
        replace: replace an existing file; False keeps it (and returns False).

    Returns:
        Whether the file was written.
    """
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)  # fails if it exists: two `up` at once keep one token
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _make_admin_token(home: Path) -> str:
    """The gateway's admin API token (kept across restarts), readable by us only."""
    import secrets

    path = home / "admin_token"
    write_private(path, secrets.token_hex(32), replace=False)
    return str(path)


def _redis_password(home: Path) -> str:
    """The password of the Redis ``up`` starts (kept across restarts), readable by us only."""
    import secrets

    path = home / "redis_password"
    write_private(path, secrets.token_hex(32), replace=False)
    return path.read_text(encoding="utf-8").strip()


def _make_token(home: Path) -> str:
    """A fresh token for the local Ray head: Ray's token authentication, readable by us only."""
    import secrets

    path = home / "ray_auth_token"
    write_private(path, secrets.token_hex(32))
    return str(path)


def _start_ray_head(home: Path, num_cpus: int | None, token_path: str) -> tuple[str, str]:
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


def stack_down(home: Path) -> list[str]:
    """Stop what ``up`` started; returns the names of the parts stopped."""
    stack = load_stack(home)
    if stack is None:
        return []
    stopped = []
    gw = stack.owned.get("gateway")
    if gw:
        ServiceProcess("gateway", int(gw["pid"]), "", Path(gw["log"])).stop()
        stopped.append("gateway")
    ray_part = stack.owned.get("ray")
    if ray_part:
        _stop_ray(ray_part["temp_dir"], stack.ray_auth_token_path)
        stopped.append("ray")
    for part in ("kafka", "redis"):
        info = stack.owned.get(part)
        if info:
            ServiceProcess(part, int(info["pid"]), "", Path(info["log"])).stop()
            stopped.append(part)
    _state_file(home).unlink(missing_ok=True)
    return stopped


def _stop_ray(temp_dir: str, token_path: str | None = None) -> None:
    """Stop the Ray processes of the head started with ``temp_dir`` (and only those).

    Ray's workers and agents rewrite their command lines (``ray::ServeReplica...``), so a
    process is also ours when its environment carries our head's token path.
    """
    marker = f"RAY_AUTH_TOKEN_PATH={token_path}".encode() if token_path else None
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ours = temp_dir in cmd
            if not ours and marker is not None:
                ours = marker in (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if ours:
            pids.append(int(proc.name))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stack_status(home: Path) -> dict[str, Any]:
    """Whether each part of the recorded stack answers."""
    stack = load_stack(home)
    if stack is None:
        return {"healthy": False, "parts": {}}
    parts: dict[str, dict[str, Any]] = {}
    host, _, port = stack.ray_address.removeprefix("ray://").rpartition(":")
    parts["ray"] = {
        "address": stack.ray_address,
        "up": _port_open(host, int(port)),
        "owned": "ray" in stack.owned,
    }
    parts["kafka"] = {
        "address": stack.kafka_bootstrap,
        "up": kafka_metadata_ready(stack.kafka_bootstrap.split(",")[0], 2.0),
        "owned": "kafka" in stack.owned,
    }
    rhost, rport = _redis_host_port(stack.redis_url)
    parts["redis"] = {
        "address": redact(stack.redis_url),
        "up": _port_open(rhost, rport),
        "owned": "redis" in stack.owned,
    }
    if stack.gateway_http:
        ghost, _, gport = stack.gateway_http.removeprefix("http://").rpartition(":")
        parts["gateway"] = {
            "address": f"{stack.gateway_http} (gRPC {stack.gateway_grpc})",
            "url": stack.gateway_http,
            "grpc": stack.gateway_grpc,
            "up": _port_open(ghost, int(gport)),
            "owned": "gateway" in stack.owned,
        }
    return {"healthy": all(p["up"] for p in parts.values()), "parts": parts}


def _redis_host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlparse

    u = urlparse(url)
    return u.hostname or "127.0.0.1", u.port or 6379


def _port_open(host: str, port: int) -> bool:
    try:
        wait_for_port(host, port, 0.5)
    except TimeoutError:
        return False
    return True
