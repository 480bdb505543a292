"""The local stack of ``eventbus up``: Ray, the Kafka-protocol broker and Redis.

Each part is either started here (a local process on a free loopback port, recorded in
``<home>/stack.json``) or taken as an existing address, in which case nothing of ours runs
for it. ``down`` stops only what ``up`` started.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eventbus._internal.ports import pick_port
from eventbus._internal.ray_head import RAY_ENV, start_ray_head, stop_ray
from eventbus._internal.redis_client import check_redis, redact
from eventbus._internal.redis_service import start_redis
from eventbus._internal.services import (
    ServiceProcess,
    free_port,
    kafka_metadata_ready,
    start_tansu,
    wait_for_port,
)
from eventbus._internal.stack_secrets import (
    make_admin_token,
    make_ray_token,
    redis_password,
    write_private,
)
from eventbus.errors import StackError

__all__ = ["Stack", "load_stack", "redact", "stack_down", "stack_status", "stack_up"]


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
    labels: dict[str, str] | None = None,
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
        labels: Ray node labels of the local head (``serving.placement.node_labels`` selects
            nodes by them).

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
        if kafka_bootstrap is None:
            kafka_bootstrap = _start_broker(home, logs, broker, started, owned, moved)
        if redis_url is not None:
            check_redis(redis_url)
        else:
            redis_url = _start_redis(home, redis_maxmemory, started, owned, moved)
        token_path: str | None = None
        if ray_address is None:
            token_path = make_ray_token(home)
            ray_address, ray_dir = start_ray_head(home, num_cpus, token_path, labels)
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
            stop_ray(owned["ray"]["temp_dir"], token_path)
        raise
    # 0600: the Redis URL in it carries the embedded Redis's password
    write_private(_state_file(home), json.dumps(asdict(stack), indent=2))
    return stack


def _start_broker(
    home: Path,
    logs: Path,
    broker: str,
    started: list[ServiceProcess],
    owned: dict[str, dict[str, Any]],
    moved: list[str],
) -> str:
    """Start the local broker (``kafka`` or ``tansu``); record it in ``started`` and ``owned``
    (and in ``moved`` why it left the port it had)."""
    if broker == "kafka":
        from eventbus._internal.kafka_broker import start_kafka

        cluster = start_kafka(home=home / "kafka", port=_kafka_port(home))
        node = cluster.nodes[0]
        assert node.proc is not None
        started.append(node.proc)
        owned["kafka"] = {"pid": node.pid, "log": str(node.proc.log_path), "kind": "kafka"}
        return cluster.bootstrap
    port, note = pick_port(home, "kafka")
    moved += [note] if note else []
    svc = start_tansu(log_dir=logs, detach=True, port=port)
    started.append(svc)
    owned["kafka"] = {"pid": svc.pid, "log": str(svc.log_path), "kind": "tansu"}
    return svc.address


def _start_redis(
    home: Path,
    maxmemory: str,
    started: list[ServiceProcess],
    owned: dict[str, dict[str, Any]],
    moved: list[str],
) -> str:
    """Start the local Redis (persistent, with a password); record it; its URL."""
    port, note = pick_port(home, "redis")
    moved += [note] if note else []
    svc = start_redis(
        port=port,
        data_dir=home / "redis",
        detach=True,
        appendonly=True,
        password=redis_password(home),
        maxmemory=maxmemory,
    )
    started.append(svc)
    owned["redis"] = {"pid": svc.pid, "log": str(svc.log_path)}
    return svc.address


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
        make_admin_token(logs.parent),  # logs is $EVENTBUS_HOME/logs
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
        stop_ray(ray_part["temp_dir"], stack.ray_auth_token_path)
        stopped.append("ray")
    for part in ("kafka", "redis"):
        info = stack.owned.get(part)
        if info:
            ServiceProcess(part, int(info["pid"]), "", Path(info["log"])).stop()
            stopped.append(part)
    _state_file(home).unlink(missing_ok=True)
    return stopped


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
