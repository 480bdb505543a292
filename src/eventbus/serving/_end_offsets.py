"""The doorbell ringer's look at partitions' log ends: one ``ListOffsets`` (v1) per leader,
built once per set of partitions and sent as bytes over a plain blocking socket, its answer
parsed with ``struct``; leaders from a ``Metadata`` (v4) request, asked again when a partition
has none or an answer carries an error.

Why not aiokafka's ``end_offsets()``: the ringer looks 20 times a second. Paced like that (a
thread waking every 50 ms, cold caches) one aiokafka look cost ~0.7 ms of CPU (its request
objects, futures, timeouts, an event loop's turn) and one of these ~0.15 ms, measured against
the embedded broker with 10 partitions (the controller's ringer thread: 1.9% of a core before).

Plaintext only: a stack whose Kafka takes TLS or SASL looks through aiokafka
(:class:`AioEndOffsets`, the same interface).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Collection
from typing import Any

from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs

__all__ = [
    "MAX_FRAME_BYTES",
    "AioEndOffsets",
    "EndOffsets",
    "KafkaWireError",
    "end_offsets_for",
    "list_offsets_request",
    "metadata_request",
    "parse_list_offsets",
    "parse_metadata",
]

#: A broker's answer larger than this is refused (a corrupt length, not a real answer: one
#: ListOffsets entry is ~40 bytes).
MAX_FRAME_BYTES = 16 * 2**20
_LIST_OFFSETS, _METADATA = 2, 3
_CORRELATION = 0x0E5B  # one request at a time per connection: a fixed id, checked
_METADATA_EVERY_S = 1.0  # leaders asked again at most this often (a deleted topic)


class KafkaWireError(OSError):
    """A broker's answer could not be read (truncated, too large, another request's)."""


def _str(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def _frame(api_key: int, version: int, client_id: str, body: bytes) -> bytes:
    header = struct.pack(">hhi", api_key, version, _CORRELATION) + _str(client_id)
    return struct.pack(">i", len(header) + len(body)) + header + body


def list_offsets_request(partitions: Collection[tuple[str, int]], client_id: str) -> bytes:
    """A framed ``ListOffsets`` v1 asking the latest offset of each partition."""
    topics: dict[str, list[int]] = {}
    for topic, part in sorted(partitions):
        topics.setdefault(topic, []).append(part)
    body = [struct.pack(">ii", -1, len(topics))]
    for topic, parts in topics.items():
        body.append(_str(topic) + struct.pack(">i", len(parts)))
        body.extend(struct.pack(">iq", p, -1) for p in parts)
    return _frame(_LIST_OFFSETS, 1, client_id, b"".join(body))


def metadata_request(topics: Collection[str], client_id: str) -> bytes:
    """A framed ``Metadata`` v4 for ``topics`` (v4: without creating a topic that is not
    there, as a broker with ``auto.create.topics.enable`` would for v1: a deleted one)."""
    names = sorted(set(topics))
    body = struct.pack(">i", len(names)) + b"".join(_str(t) for t in names) + b"\x00"
    return _frame(_METADATA, 4, client_id, body)


class _Reader:
    """Reads a response body; any read past its end is a :class:`KafkaWireError`."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> tuple[Any, ...]:
        try:
            out = struct.unpack_from(fmt, self.data, self.pos)
        except struct.error as e:
            msg = f"a truncated Kafka answer ({len(self.data)} bytes; {e})"
            raise KafkaWireError(msg) from e
        self.pos += struct.calcsize(fmt)
        return out

    def string(self) -> str | None:
        (n,) = self.take(">h")
        if n < 0:
            return None
        raw = self.data[self.pos : self.pos + n]
        if len(raw) != n:
            msg = f"a truncated Kafka answer (a string of {n} bytes at {self.pos})"
            raise KafkaWireError(msg)
        self.pos += n
        return raw.decode(errors="replace")

    def count(self) -> int:
        (n,) = self.take(">i")
        if n < 0 or n > len(self.data):  # each entry takes at least a byte
            msg = f"a malformed Kafka answer (an array of {n} entries in {len(self.data)} bytes)"
            raise KafkaWireError(msg)
        return int(n)

    def correlation(self) -> None:
        (cid,) = self.take(">i")
        if cid != _CORRELATION:
            msg = f"a Kafka answer to another request (correlation id {cid}, not {_CORRELATION})"
            raise KafkaWireError(msg)


def parse_list_offsets(body: bytes) -> tuple[dict[str, int], bool]:
    """A ``ListOffsets`` v1 answer: ``topic[partition]`` -> log end of the partitions that
    answered without error, and whether some partition answered with one."""
    r = _Reader(body)
    r.correlation()
    ends: dict[str, int] = {}
    errors = False
    for _ in range(r.count()):
        topic = r.string()
        n = r.count()
        if 22 * n > len(body) - r.pos:  # 22 bytes each: a count the answer cannot hold
            msg = f"a truncated Kafka answer ({n} partitions of {topic!r} in {len(body)} bytes)"
            raise KafkaWireError(msg)
        size = 22 * n
        entries = struct.iter_unpack(">ihqq", memoryview(body)[r.pos : r.pos + size])
        r.pos += size  # one struct pass per topic (a call per partition was half of a look)
        for part, error, _ts, offset in entries:
            if error or topic is None:
                errors = True
            else:
                ends[f"{topic}[{part}]"] = offset
    return ends, errors


def parse_metadata(body: bytes) -> tuple[dict[int, tuple[str, int]], dict[tuple[str, int], int]]:
    """A ``Metadata`` v4 answer: node id -> (host, port), and (topic, partition) -> leader
    node of the partitions that have one."""
    r = _Reader(body)
    r.correlation()
    r.take(">i")  # throttle time
    brokers: dict[int, tuple[str, int]] = {}
    for _ in range(r.count()):
        (node,) = r.take(">i")
        host = r.string()
        (port,) = r.take(">i")
        r.string()  # rack
        if host is not None:
            brokers[node] = (host, port)
    r.string()  # cluster id
    r.take(">i")  # controller id
    leaders: dict[tuple[str, int], int] = {}
    for _ in range(r.count()):
        (_error,) = r.take(">h")
        topic = r.string()
        r.take(">b")  # is_internal
        for _ in range(r.count()):
            error, part, leader = r.take(">hii")
            for _ in range(2):  # replicas, isr
                r.take(f">{r.count()}i")
            if topic is not None and not error and leader >= 0:
                leaders[(topic, part)] = leader
    return brokers, leaders


class EndOffsets:
    """Log ends of partitions from a plaintext Kafka, cheaply (see the module).

    Not thread-safe: one thread looks. Args:
        bootstrap: ``host:port[,host:port...]``.
        client_id: the client id the broker logs.
        timeout_s: the longest a request waits for its answer.
    """

    def __init__(
        self, bootstrap: str, client_id: str = "eventbus-doorbell", timeout_s: float = 5.0
    ) -> None:
        self.bootstrap = [_address(a) for a in bootstrap.split(",") if a.strip()]
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._socks: dict[int | str, socket.socket] = {}  # node id (or "bootstrap") -> socket
        self._brokers: dict[int, tuple[str, int]] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._meta_at = -_METADATA_EVERY_S
        self._stale = True  # leaders to be asked again
        #: the prebuilt request of each leader for the partitions looked at last
        self._requests: dict[int, bytes] = {}
        self._asked: frozenset[tuple[str, int]] = frozenset()

    def ends(self, partitions: Collection[tuple[str, int]]) -> dict[str, int]:
        """``topic[partition]`` -> log end, for the partitions that have a leader now.

        Raises:
            OSError: the broker cannot be reached or answered nonsense (:class:`KafkaWireError`).
        """
        wanted = frozenset(partitions)
        if not wanted:
            return {}
        unknown = any(tp not in self._leaders for tp in wanted)
        if (self._stale or unknown) and time.monotonic() - self._meta_at >= _METADATA_EVERY_S:
            self._metadata({t for t, _ in wanted})
            self._asked = frozenset()
        if wanted != self._asked:
            by_node: dict[int, list[tuple[str, int]]] = {}
            for tp in wanted:
                node = self._leaders.get(tp)
                if node is not None:
                    by_node.setdefault(node, []).append(tp)
            self._requests = {
                n: list_offsets_request(tps, self.client_id) for n, tps in by_node.items()
            }
            self._asked = wanted
        out: dict[str, int] = {}
        for node, request in self._requests.items():
            ends, errors = parse_list_offsets(self._ask(node, request))
            out.update(ends)
            self._stale = self._stale or errors
        return out

    def close(self) -> None:
        """Close the connections (idempotent; a later look opens them again)."""
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()

    def _metadata(self, topics: set[str]) -> None:
        self._meta_at = time.monotonic()
        brokers, leaders = parse_metadata(
            self._ask("bootstrap", metadata_request(topics, self.client_id))
        )
        if brokers != self._brokers:  # a broker moved: its connection is opened again
            for node in [n for n in self._socks if n != "bootstrap"]:
                self._socks.pop(node).close()
        self._brokers, self._leaders, self._stale = brokers, leaders, False

    def _ask(self, node: int | str, request: bytes) -> bytes:
        sock = self._socks.get(node)
        try:
            if sock is None:
                sock = self._socks[node] = self._connect(node)
            sock.sendall(request)
            (size,) = struct.unpack(">i", self._read(sock, 4))
            if not 4 <= size <= MAX_FRAME_BYTES:
                msg = f"a Kafka answer of {size} bytes (at most {MAX_FRAME_BYTES} taken)"
                raise KafkaWireError(msg)
            return self._read(sock, size)
        except OSError:
            self._socks.pop(node, None)
            if sock is not None:
                sock.close()
            self._stale = True
            raise

    def _connect(self, node: int | str) -> socket.socket:
        addresses = self.bootstrap if node == "bootstrap" else [self._brokers[int(node)]]
        error: OSError | None = None
        for address in addresses:
            try:
                sock = socket.create_connection(address, timeout=self.timeout_s)
            except OSError as e:
                error = e
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        assert error is not None
        raise error

    @staticmethod
    def _read(sock: socket.socket, size: int) -> bytes:
        buf = bytearray()
        while len(buf) < size:
            chunk = sock.recv(min(size - len(buf), 1 << 20))
            if not chunk:
                msg = f"the broker closed the connection ({len(buf)} of {size} bytes read)"
                raise KafkaWireError(msg)
            buf += chunk
        return bytes(buf)


class AioEndOffsets:
    """The same look through aiokafka, on a private event loop (TLS and SASL stacks).

    Args:
        bootstrap: the broker.
        client: its connection settings.
    """

    def __init__(self, bootstrap: str, client: KafkaClientConfig | None) -> None:
        self.bootstrap = bootstrap
        self.client = client
        self._loop = asyncio.new_event_loop()
        self._consumer: Any = None

    def ends(self, partitions: Collection[tuple[str, int]]) -> dict[str, int]:
        """As :meth:`EndOffsets.ends`."""
        return self._loop.run_until_complete(self._ends(partitions))

    async def _ends(self, partitions: Collection[tuple[str, int]]) -> dict[str, int]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                client_id="eventbus-doorbell",
                **kafka_client_kwargs(self.client),
            )
            await consumer.start()
            self._consumer = consumer
        tps = [TopicPartition(t, p) for t, p in sorted(partitions)]
        # bounded: aiokafka waits for the metadata of a topic deleted meanwhile
        offsets = await asyncio.wait_for(self._consumer.end_offsets(tps), 5.0) if tps else {}
        return {f"{tp.topic}[{tp.partition}]": end for tp, end in offsets.items()}

    def close(self) -> None:
        """Stop the consumer."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            self._loop.run_until_complete(consumer.stop())


def end_offsets_for(bootstrap: str, client: KafkaClientConfig | None) -> EndOffsets | AioEndOffsets:
    """The cheap raw look on a plaintext Kafka, aiokafka's otherwise."""
    if client is None or client.security_protocol == "PLAINTEXT":
        return EndOffsets(bootstrap)
    return AioEndOffsets(bootstrap, client)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)
