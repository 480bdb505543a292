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

import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from eventbus._internal.kafka_jars import KAFKA_VERSION, kafka_classpath
from eventbus._internal.kafka_node import (
    _HOST,
    KafkaNode,
    _cluster_id,
    _properties,
    _start_node,
    _wait_nodes,
    quorum_leader,
)
from eventbus._internal.kafka_security import KafkaSecurity, secured_ready
from eventbus._internal.services import (
    free_port,
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


class KafkaCluster:
    """Apache Kafka nodes in KRaft mode on loopback, each a combined broker and controller.

    Made by :func:`start_kafka` (one node) and :func:`start_kafka_cluster` (several). A node can
    be killed, stopped and started again in place (same ports, same storage). With ``hosts``
    (one address per node) each node listens on and advertises its own address instead of
    loopback, and ``launchers`` (one command prefix per node, see :class:`KafkaNode`) start
    each node's JVM on its host (a test host's ``ip netns exec NAME``).

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
        hosts: Sequence[str] | None = None,
        launchers: Sequence[Sequence[str]] | None = None,
    ) -> None:
        for what, given in (("hosts", hosts), ("launchers", launchers), ("ports", ports)):
            if given is not None and len(given) != n_nodes:
                msg = (
                    f"{what}={list(given)!r} names {len(given)} nodes for a cluster of "
                    f"{n_nodes}: give one per node, or none"
                )
                raise StackError(msg)
        if hosts is not None and security is not None:
            msg = "a cluster on other hosts (hosts=) serves plaintext only: drop security="
            raise StackError(msg)
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
            node = KafkaNode(i + 1, port, free_port(), self.home / f"node{i + 1}")
            node.host = hosts[i] if hosts else _HOST
            node.launcher = tuple(launchers[i]) if launchers else ()
            self.nodes.append(node)
        self._ports_file = self.home / "controller_ports"
        if self._ports_file.exists():  # restarting a stack: the quorum's ports stay the same
            saved = [int(p) for p in self._ports_file.read_text().split()]
            if len(saved) == n_nodes:
                for node, p in zip(self.nodes, saved, strict=True):
                    node.controller_port = p
        self._ports_file.write_text(" ".join(str(n.controller_port) for n in self.nodes))
        self.voters = ",".join(f"{n.node_id}@{n.controller_address}" for n in self.nodes)

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
        for node in self.nodes:
            if node.address == address:
                return node
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
        """The node that is the active KRaft controller now (the quorum's leader), as the live
        nodes recorded it (:func:`quorum_leader`), once one names a live leader.

        DescribeCluster's and Metadata's ``controller_id`` cannot tell: in KRaft mode a broker
        answers them with a random live broker.

        Raises:
            StackError: no live node named a leader within ``timeout_s`` (an election that
                does not end: fewer than a majority of the voters alive).
        """
        deadline = time.monotonic() + timeout_s
        last = "no live node"
        while True:
            seen: list[tuple[int, int]] = []
            for node in self.nodes:
                if not node.pid:
                    continue
                try:
                    seen.append(quorum_leader(node))
                except (OSError, ValueError) as e:
                    last = f"node {node.node_id}: {type(e).__name__}: {e}"
            # the newest epoch a live node recorded names the leader; a majority elected it
            leader, epoch = max(seen, key=lambda le: le[1], default=(-1, -1))
            if leader >= 1 and self.nodes[leader - 1].pid:
                return self.nodes[leader - 1]
            if seen:
                last = f"leader {leader} at epoch {epoch} (an election is running)"
            if time.monotonic() > deadline:
                msg = f"no active KRaft controller found within {timeout_s:g} s ({last})"
                raise StackError(msg)
            time.sleep(0.1)

    def alive(self) -> bool:
        """Whether every node runs."""
        return all(n.pid for n in self.nodes)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop every node (SIGTERM: a controlled shutdown, then SIGKILL). Safe to call twice.

        The nodes stop together: each one's broker shuts down while the controller quorum still
        stands. One after another, the last ones' controlled shutdown waits for a quorum that
        is gone, until the SIGKILL ``timeout_s`` later."""
        for node in self.nodes:  # a stopped (SIGSTOP) node cannot take SIGTERM
            if node.pid:
                node.signal(signal.SIGCONT)
        running = [node for node in self.nodes if node.proc is not None]
        threads = [
            threading.Thread(target=node.proc.stop, args=(timeout_s,), daemon=True)
            for node in running
            if node.proc is not None
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for node in running:
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
    hosts: Sequence[str] | None = None,
    launchers: Sequence[Sequence[str]] | None = None,
) -> KafkaCluster:
    """Start an Apache Kafka cluster of ``n_nodes`` combined nodes (a KRaft quorum of all of
    them); with three or more, topics default to replication 3 and ``min.insync.replicas`` 2.

    ``hosts`` and ``launchers`` (one per node) put each node on its own host (see
    :class:`KafkaCluster`); by default every node runs here on loopback.

    Raises:
        StackError: as :func:`start_kafka`; ``hosts`` or ``launchers`` not one per node.
    """
    cluster = KafkaCluster(
        home,
        n_nodes,
        extra=extra,
        heap_mb=heap_mb,
        security=security,
        hosts=hosts,
        launchers=launchers,
    )
    try:
        cluster.start(timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster
