"""One Apache Kafka node (combined KRaft broker and controller) as a local process: its
``server.properties``, its storage format, its start and its readiness; and what it recorded
of the KRaft quorum (:func:`quorum_leader`). :mod:`.kafka_broker` runs clusters of them.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eventbus._internal.kafka_jars import java, kafka_classpath
from eventbus._internal.kafka_security import write_private
from eventbus._internal.services import (
    ServiceProcess,
    _launch,
    _tail,
    kafka_metadata_ready,
)
from eventbus.errors import StackError

__all__ = ["KafkaNode", "quorum_leader"]

_HOST = "127.0.0.1"
_LOG4J = """\
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
logger.ctl.name = org.apache.kafka.controller.QuorumController
logger.ctl.level = INFO
"""


def _cluster_id() -> str:
    """A KRaft cluster id; never one that starts with ``-`` (a command line reads it as a flag).

    Kafka's own ``Uuid.randomUuid`` draws again for the same reason.
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


@dataclass
class KafkaNode:
    """One Kafka process (broker + controller) and what it needs to start again.

    Attributes:
        node_id: its KRaft node id.
        port: its client listener (``host:port``).
        controller_port: its controller listener (``host:controller_port``).
        home: its directory (``server.properties``, ``data/``, the log).
        host: the address it listens on and advertises (``127.0.0.1``: loopback only).
        launcher: a command prefix the JVM runs under, which must exec it in place (same
            pid), e.g. ``("ip", "netns", "exec", "NAME")`` to start it on another (namespace)
            host whose address is ``host``; empty: run directly.
        proc: the running process, None while stopped.
    """

    node_id: int
    port: int
    controller_port: int
    home: Path
    host: str = _HOST
    launcher: tuple[str, ...] = ()
    proc: ServiceProcess | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """``host:port``, its client listener."""
        return f"{self.host}:{self.port}"

    @property
    def controller_address(self) -> str:
        """``host:controller_port``, its KRaft controller listener."""
        return f"{self.host}:{self.controller_port}"

    @property
    def pid(self) -> int:
        """The process id (0 while stopped)."""
        return self.proc.pid if self.proc is not None and self.proc.alive() else 0

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process (SIGKILL, SIGSTOP, SIGCONT) and, for SIGKILL, reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.stop(5)
            self.proc = None


def _properties(
    node: KafkaNode, voters: str, n_nodes: int, extra: dict[str, str] | None
) -> dict[str, str]:
    rf = str(min(3, n_nodes))
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{node.address},CONTROLLER://{node.controller_address}",
        "advertised.listeners": f"PLAINTEXT://{node.address}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(node.home / "data"),
        "num.partitions": "1",
        "default.replication.factor": rf,
        "min.insync.replicas": "2" if n_nodes >= 3 else "1",
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": "2" if n_nodes >= 3 else "1",
        "transaction.state.log.num.partitions": "10",
        # a new group's first member is not held 3 s waiting for others (a local stack)
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        # several nodes: a dead broker is fenced after 3 s of missed heartbeats (default 9 s);
        # one node (a stack, a benchmark) has no one to fence and keeps Kafka's defaults
        "broker.session.timeout.ms": "3000" if n_nodes > 1 else "9000",
        "broker.heartbeat.interval.ms": "500" if n_nodes > 1 else "2000",
        # one node: the controller's no-op record every 5 s instead of every 0.5 s (it only
        # shows followers that the quorum is alive); the idle broker's CPU 3.4% -> 1.8% of a core
        "metadata.max.idle.interval.ms": "500" if n_nodes > 1 else "5000",
        "log.message.timestamp.after.max.ms": "86400000",
        # the log cleaner looks for compactable logs every second (default 15 s)
        "log.cleaner.backoff.ms": "1000",
    }
    props.update(extra or {})
    return props


def _start_node(
    node: KafkaNode,
    props: dict[str, str],
    cluster_id: str,
    heap_mb: int,
    format_args: list[str] | None = None,
) -> None:
    java_bin, cp = java(), kafka_classpath()
    node.home.mkdir(parents=True, exist_ok=True)
    conf = node.home / "server.properties"  # 0600: it may hold the admin's password
    write_private(conf, "".join(f"{k}={v}\n" for k, v in props.items()))
    log4j = node.home / "log4j2.properties"
    log4j.write_text(_LOG4J)
    jvm = [
        java_bin,
        f"-Xmx{heap_mb}m",
        f"-Xms{min(heap_mb, 128)}m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        cp,
    ]
    data = node.home / "data"
    if not (data / "meta.properties").exists():
        fmt = [*jvm, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(conf)]
        fmt += format_args or []
        proc = subprocess.run(fmt, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            msg = (
                f"formatting Kafka storage {data} failed (exit {proc.returncode}): "
                f"{(proc.stdout + proc.stderr)[-1500:]}\nfix: delete {data} and start again"
            )
            raise StackError(msg)
    argv = [*node.launcher, *jvm, "kafka.Kafka", str(conf)]
    node.proc = _launch("kafka", argv, node.home / "kafka.log", node.address, True)


def _wait_nodes(
    nodes: list[KafkaNode], timeout_s: float, ready: Callable[[str], bool] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    answers = ready or (lambda address: kafka_metadata_ready(address, 1.0))
    for node in nodes:
        while not answers(node.address):
            proc = node.proc
            if proc is None or not proc.alive():
                log = node.home / "kafka.log"
                msg = (
                    f"Apache Kafka node {node.node_id} exited while starting ({node.address}); "
                    f"log {log}:\n{_tail(log)}\nfix: check that the ports are free and that "
                    f"{node.home / 'data'} belongs to this cluster (delete it to start afresh)"
                )
                raise StackError(msg)
            if time.monotonic() > deadline:
                msg = (
                    f"Apache Kafka node {node.node_id} did not answer on {node.address} within "
                    f"{timeout_s:g} s; log {node.home / 'kafka.log'}:\n"
                    f"{_tail(node.home / 'kafka.log')}"
                )
                raise StackError(msg)
            time.sleep(0.1)


def quorum_leader(node: KafkaNode) -> tuple[int, int]:
    """The KRaft quorum's leader (the active controller) as ``node`` last recorded it: its
    ``quorum-state`` file (``__cluster_metadata-0`` in the node's log dir), which the node
    rewrites at every election it sees. Returns ``(leader id, leader epoch)``; ``(-1, epoch)``
    while it votes.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not the JSON the node writes.
    """
    import json

    path = node.home / "data" / "__cluster_metadata-0" / "quorum-state"
    state = json.loads(path.read_text())
    return int(state.get("leaderId", -1)), int(state.get("leaderEpoch", -1))
