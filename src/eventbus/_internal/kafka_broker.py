"""Apache Kafka (KRaft mode) as local processes: one combined broker + controller, or a
cluster of several, on loopback ports.

The broker's jars come from Maven Central (:mod:`.kafka_jars`: :func:`kafka_classpath`
resolves them once into a cache outside any checkout); Java 17 or newer runs it. Storage lives
on disk under the directory the caller gives, so records survive a stop and a start on the same
directory. With ``security=`` (:class:`~.kafka_security.KafkaSecurity`) the client listener
serves TLS and/or SASL/SCRAM-SHA-512 logins, and ACLs.

Example:
    >>> broker = start_kafka(home=Path("/tmp/eb/kafka"))    # doctest: +SKIP
    >>> broker.address                                       # doctest: +SKIP
    '127.0.0.1:40123'
    >>> broker.stop()                                        # doctest: +SKIP
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eventbus._internal.kafka_jars import KAFKA_VERSION, java, kafka_classpath
from eventbus._internal.kafka_security import KafkaSecurity, secured_ready, write_private
from eventbus._internal.services import (
    ServiceProcess,
    _launch,
    _recv_exact,
    _tail,
    free_port,
    kafka_metadata_ready,
)
from eventbus.errors import StackError

if TYPE_CHECKING:
    from eventbus.eventing import KafkaClientConfig

__all__ = [
    "KAFKA_VERSION",
    "KafkaCluster",
    "KafkaNode",
    "KafkaSecurity",
    "kafka_classpath",
    "quorum_leader",
    "start_kafka",
    "start_kafka_cluster",
]

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
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass
class KafkaNode:
    """One Kafka process (broker + controller) and what it needs to start again.

    Attributes:
        node_id: its KRaft node id.
        port: its client listener (``127.0.0.1:port``).
        controller_port: its controller listener.
        home: its directory (``server.properties``, ``data/``, the log).
        proc: the running process, None while stopped.
    """

    node_id: int
    port: int
    controller_port: int
    home: Path
    proc: ServiceProcess | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """``127.0.0.1:port``."""
        return f"{_HOST}:{self.port}"

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
        "listeners": f"PLAINTEXT://{_HOST}:{node.port},CONTROLLER://{_HOST}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{_HOST}:{node.port}",
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
        # a dead broker is fenced after 3 s of missed heartbeats (default 9 s)
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
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
    node.proc = _launch(
        "kafka", [*jvm, "kafka.Kafka", str(conf)], node.home / "kafka.log", node.address, True
    )


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


class KafkaCluster:
    """Apache Kafka nodes in KRaft mode on loopback, each a combined broker and controller.

    Made by :func:`start_kafka` (one node) and :func:`start_kafka_cluster` (several). A node can
    be killed, stopped and started again in place (same ports, same storage).

    Attributes:
        nodes: the nodes, by position (node ids 1..n).
        bootstrap: every node's client address, comma-separated.
        security: how the client listener is secured (None: plaintext).
    """

    def __init__(
        self,
        home: Path,
        n_nodes: int,
        *,
        ports: list[int] | None = None,
        extra: dict[str, str] | None = None,
        heap_mb: int = 512,
        security: KafkaSecurity | None = None,
    ) -> None:
        self.home = Path(home)
        self.heap_mb = heap_mb
        self.extra = dict(extra or {})
        self.security = security
        id_file = self.home / "cluster_id"
        self.home.mkdir(parents=True, exist_ok=True)
        if not id_file.exists():
            id_file.write_text(_cluster_id())
        self.cluster_id = id_file.read_text().strip()
        self.nodes = []
        for i in range(n_nodes):
            port = ports[i] if ports else free_port()
            self.nodes.append(KafkaNode(i + 1, port, free_port(), self.home / f"node{i + 1}"))
        self._ports_file = self.home / "controller_ports"
        if self._ports_file.exists():  # restarting a stack: the quorum's ports stay the same
            saved = [int(p) for p in self._ports_file.read_text().split()]
            if len(saved) == n_nodes:
                for node, p in zip(self.nodes, saved, strict=True):
                    node.controller_port = p
        self._ports_file.write_text(" ".join(str(n.controller_port) for n in self.nodes))
        self.voters = ",".join(f"{n.node_id}@{_HOST}:{n.controller_port}" for n in self.nodes)

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated."""
        return ",".join(n.address for n in self.nodes)

    @property
    def address(self) -> str:
        """The bootstrap servers (as :attr:`ServiceProcess.address`)."""
        return self.bootstrap

    @property
    def admin_client(self) -> KafkaClientConfig | None:
        """The admin's client settings on a secured cluster (None: plaintext, no settings)."""
        if self.security is None:
            return None
        return self.security.admin_client(self.home)

    def props(self, node: KafkaNode) -> dict[str, str]:
        """The ``server.properties`` of ``node``."""
        extra = dict(self.extra)
        if self.security is not None:  # the listeners' security, under the caller's extra
            sec = self.security.properties(node.port, node.controller_port, self.home)
            extra = sec | extra
        return _properties(node, self.voters, len(self.nodes), extra)

    def start(self, timeout_s: float = 90.0) -> None:
        """Start every stopped node and wait until each answers."""
        stopped = [n for n in self.nodes if n.pid == 0]
        for node in stopped:
            self._start_node(node)
        _wait_nodes(stopped, timeout_s, self._ready())

    def start_node(self, node: KafkaNode, timeout_s: float = 90.0) -> None:
        """Start one stopped node again (same ports, same storage) and wait until it answers."""
        self._start_node(node)
        _wait_nodes([node], timeout_s, self._ready())

    def _start_node(self, node: KafkaNode) -> None:
        fmt = self.security.format_args() if self.security is not None else None
        _start_node(node, self.props(node), self.cluster_id, self.heap_mb, fmt)

    def _ready(self) -> Callable[[str], bool] | None:
        client = self.admin_client
        if client is None:
            return None
        return lambda address: secured_ready(address, client, 2.0)

    def node_at(self, address: str) -> KafkaNode:
        """The node whose client listener is ``address`` (``host:port``)."""
        port = int(address.rsplit(":", 1)[1])
        for node in self.nodes:
            if node.port == port:
                return node
        msg = f"no node of this cluster listens on {address}; its nodes: {self.bootstrap}"
        raise StackError(msg)

    def stop_node(self, node: KafkaNode, timeout_s: float = 30.0) -> None:
        """Stop one node with SIGTERM (a controlled shutdown: its leaderships move first),
        SIGKILL after ``timeout_s``; :meth:`start_node` starts it again."""
        if node.pid:
            node.signal(signal.SIGCONT)  # a stopped (SIGSTOP) node cannot take SIGTERM
        if node.proc is not None:
            node.proc.stop(timeout_s)
            node.proc = None

    def active_controller(self, timeout_s: float = 10.0) -> KafkaNode:
        """The node that is the active KRaft controller now (the quorum's leader), asked of
        the live nodes with DescribeQuorum (:func:`quorum_leader`) until one knows it.

        DescribeCluster's and Metadata's ``controller_id`` cannot tell: in KRaft mode a broker
        answers them with a random live broker.

        Raises:
            StackError: no live node named a leader within ``timeout_s`` (an election that
                does not end: fewer than a majority of the voters alive).
        """
        deadline = time.monotonic() + timeout_s
        last = "no live node"
        while True:
            for node in self.nodes:
                if not node.pid:
                    continue
                try:
                    leader = quorum_leader(node.address, 2.0)
                except (OSError, struct.error, ValueError) as e:
                    last = f"node {node.node_id}: {type(e).__name__}: {e}"
                    continue
                if leader >= 0 and self.nodes[leader - 1].pid:
                    return self.nodes[leader - 1]
                # -1: an election runs; a stopped node: the quorum has not noticed yet
                last = f"node {node.node_id}: leader {leader} (an election is running)"
            if time.monotonic() > deadline:
                msg = f"no active KRaft controller found within {timeout_s:g} s ({last})"
                raise StackError(msg)
            time.sleep(0.1)

    def alive(self) -> bool:
        """Whether every node runs."""
        return all(n.pid for n in self.nodes)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop every node (SIGTERM: a controlled shutdown, then SIGKILL). Safe to call twice."""
        for node in self.nodes:  # a stopped (SIGSTOP) node cannot take SIGTERM
            if node.pid:
                node.signal(signal.SIGCONT)
        for node in reversed(self.nodes):
            if node.proc is not None:
                node.proc.stop(timeout_s)
                node.proc = None


def start_kafka(
    *,
    home: Path,
    port: int | None = None,
    extra: dict[str, str] | None = None,
    heap_mb: int = 512,
    timeout_s: float = 90.0,
    security: KafkaSecurity | None = None,
) -> KafkaCluster:
    """Start a single-node Apache Kafka (KRaft, combined broker and controller) on loopback.

    Its storage is ``home/node1/data``: starting again on the same ``home`` keeps the records.
    The process is detached (its own session): it outlives the caller until stopped.

    Args:
        home: its directory.
        port: the client port; a free one when None.
        extra: more ``server.properties`` (they win over the defaults).
        heap_mb: the JVM's heap.
        timeout_s: how long to wait until it answers a metadata request.
        security: serve TLS, SASL/SCRAM-SHA-512 and ACLs on the client listener (see
            :class:`~eventbus._internal.kafka_security.KafkaSecurity`); the admin's client
            settings are then :attr:`KafkaCluster.admin_client`.

    Returns:
        The cluster of one; ``address`` is the bootstrap ``127.0.0.1:PORT``.

    Raises:
        StackError: no Java, no jars, or the broker did not start (its log's tail included).
    """
    cluster = KafkaCluster(
        home, 1, ports=[port] if port else None, extra=extra, heap_mb=heap_mb, security=security
    )
    try:
        cluster.start(timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_kafka_cluster(
    *,
    home: Path,
    n_nodes: int = 3,
    extra: dict[str, str] | None = None,
    heap_mb: int = 384,
    timeout_s: float = 120.0,
    security: KafkaSecurity | None = None,
) -> KafkaCluster:
    """Start an Apache Kafka cluster of ``n_nodes`` combined nodes (a KRaft quorum of all of
    them); with three or more, topics default to replication 3 and ``min.insync.replicas`` 2.

    Raises:
        StackError: as :func:`start_kafka`.
    """
    cluster = KafkaCluster(home, n_nodes, extra=extra, heap_mb=heap_mb, security=security)
    try:
        cluster.start(timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_uvarint(buf: bytes, at: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[at]
        at += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, at
        shift += 7


def quorum_leader(address: str, timeout_s: float = 5.0) -> int:
    """The node id of the KRaft quorum's leader (the active controller) as the node at
    ``address`` (``host:port``, a client listener) knows it: DescribeQuorum v0 (KIP-595; what
    ``kafka-metadata-quorum describe --status`` sends), which a broker forwards to the
    controllers. -1 while an election runs.

    Raises:
        OSError: the node does not answer.
        ValueError: it answers with an error code (named).
    """
    host, _, port = address.rpartition(":")
    client_id = b"eventbus-probe"
    topic = b"__cluster_metadata"
    # header v2 (flexible): api_key 55, version 0, correlation id, client_id, no tagged fields;
    # body: one topic (compact string) with one partition (0), no tagged fields anywhere.
    header = struct.pack(">hhih", 55, 0, 1, len(client_id)) + client_id + b"\x00"
    body = (
        _uvarint(2)
        + _uvarint(len(topic) + 1)
        + topic
        + _uvarint(2)
        + struct.pack(">i", 0)
        + b"\x00\x00\x00"
    )
    request = header + body
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.settimeout(timeout_s)
        s.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exact(s, 4))
        payload = _recv_exact(s, size)
    # response header v1: correlation id, tagged fields; body: error code, topics, ...
    _, at = _read_uvarint(payload, 4)
    (error,) = struct.unpack_from(">h", payload, at)
    if error:
        msg = f"DescribeQuorum to {address} answered error code {error}"
        raise ValueError(msg)
    n_topics, at = _read_uvarint(payload, at + 2)
    if n_topics < 2:
        msg = f"DescribeQuorum to {address} answered no topic"
        raise ValueError(msg)
    name_len, at = _read_uvarint(payload, at)
    at += name_len - 1
    n_parts, at = _read_uvarint(payload, at)
    if n_parts < 2:
        msg = f"DescribeQuorum to {address} answered no partition"
        raise ValueError(msg)
    _index, p_error, leader = struct.unpack_from(">ihi", payload, at)
    if p_error:
        msg = f"DescribeQuorum to {address} answered partition error code {p_error}"
        raise ValueError(msg)
    return int(leader)
