"""The broker a Kafka benchmark runs on, started by the benchmark itself: ``--broker kafka``
(the default: Apache Kafka, one KRaft node in a temporary home, ``eventbus._internal.
kafka_broker``) or ``--broker tansu`` (the embedded Tansu broker of ``eventbus up``, memory
storage). Every process of a benchmark reaches it on loopback at :attr:`Broker.bootstrap`.

With ``tls=True`` clients talk TLS to it, with a CA made by ``trustme``: Apache Kafka
terminates TLS itself (a second listener, PEM key and certificate); Tansu cannot, so it runs
behind Debian's ``stunnel4`` (``tests/fixtures/kafka_tls.py``). :attr:`Broker.client` then
holds the clients' settings (``security_protocol: SSL``, ``ca_file``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

#: The brokers a benchmark can start; the first is the default.
BROKERS = ("kafka", "tansu")


def add_broker_arg(ap: argparse.ArgumentParser) -> None:
    """``--broker kafka|tansu`` on a benchmark's command line."""
    ap.add_argument(
        "--broker",
        choices=BROKERS,
        default=BROKERS[0],
        help="the broker the benchmark starts and runs on: kafka (Apache Kafka, one KRaft "
        "node; the default) or tansu (the embedded broker of `eventbus up`, memory storage)",
    )


@dataclass
class Broker:
    """A broker a benchmark started.

    Attributes:
        kind: ``kafka`` or ``tansu``.
        bootstrap: ``127.0.0.1:PORT`` (the TLS port with ``tls``).
        pids: its processes (the broker's CPU is counted from them).
        client: the clients' connection settings (a ``KafkaClientConfig``; None: plaintext).
    """

    kind: str
    bootstrap: str
    pids: list[int]
    client: Any = None
    _stop: Callable[[], None] = field(default=lambda: None, repr=False)

    @property
    def address(self) -> str:
        """The bootstrap servers (as ``ServiceProcess.address``)."""
        return self.bootstrap

    def stop(self) -> None:
        """Stop it (safe to call twice)."""
        stop, self._stop = self._stop, lambda: None
        stop()


def start_broker(kind: str, work: Path, *, tls: bool = False) -> Broker:
    """Start a ``kind`` broker (``kafka`` or ``tansu``) with its files under ``work``.

    Raises:
        StackError: it did not start (no Java or jars for Kafka: ``make kafka``).
        ValueError: an unknown ``kind``.
    """
    work.mkdir(parents=True, exist_ok=True)
    if kind == "kafka":
        return _kafka(work / "kafka", tls)
    if kind == "tansu":
        return _tansu(work, tls)
    msg = f"unknown broker {kind!r}; choose from {', '.join(BROKERS)}"
    raise ValueError(msg)


def _tansu(work: Path, tls: bool) -> Broker:
    if tls:
        sys.path.insert(0, str(ROOT))
        from tests.fixtures.kafka_tls import TlsBroker

        tb = TlsBroker(work)
        return Broker("tansu", tb.address, [tb.tansu.pid, tb.stunnel.pid], tb.client(), tb.stop)
    from eventbus._internal.services import start_tansu

    svc = start_tansu(log_dir=work)
    return Broker("tansu", svc.address, [svc.pid], None, svc.stop)


def _kafka(home: Path, tls: bool) -> Broker:
    from eventbus._internal.kafka_broker import KafkaCluster
    from eventbus._internal.services import free_port

    cluster = KafkaCluster(home, 1)
    node = cluster.nodes[0]
    bootstrap, client = node.address, None
    if tls:
        client, bootstrap = _kafka_tls(cluster, home, free_port())
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise

    def stop() -> None:
        cluster.stop()
        # the records of a benchmark's topics (its log and config stay, for a look after)
        shutil.rmtree(node.home / "data", ignore_errors=True)

    return Broker("kafka", bootstrap, [node.pid], client, stop)


def _kafka_tls(cluster: Any, home: Path, tls_port: int) -> tuple[Any, str]:
    """A second listener, ``SSL`` on ``tls_port``, beside the plaintext one (which only the
    readiness probe uses): a client that bootstraps on the TLS port is handed that port."""
    import trustme
    from cryptography.hazmat.primitives import serialization

    from eventbus.eventing import KafkaClientConfig

    home.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    # Kafka's PEM key store takes PKCS#8 keys only
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), None)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    keystore = home / "server-keystore.pem"
    keystore.write_bytes(pkcs8 + chain)
    ca_file = home / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    node = cluster.nodes[0]
    host = "127.0.0.1"
    cluster.extra.update(
        {
            "listeners": f"PLAINTEXT://{host}:{node.port},SSL://{host}:{tls_port},"
            f"CONTROLLER://{host}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{node.port},SSL://{host}:{tls_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,CONTROLLER:PLAINTEXT",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
        }
    )
    client = KafkaClientConfig.model_validate({"security_protocol": "SSL", "ca_file": str(ca_file)})
    return client, f"{host}:{tls_port}"
