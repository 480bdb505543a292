"""The ringer's raw look at partition ends without a broker: its requests read back by
aiokafka's own protocol classes, answers encoded by them parsed, and hostile answers (truncated,
another request's, absurd sizes) refused with a clear error, never a hang (the look against
the real broker: tests/integration/test_scale_to_zero.py)."""

from __future__ import annotations

import socket
import struct
import threading

import pytest
from aiokafka.protocol.metadata import MetadataRequest_v4, MetadataResponse_v4
from aiokafka.protocol.offset import OffsetRequest_v1, OffsetResponse_v1

from eventbus.serving._end_offsets import (
    _CORRELATION,
    EndOffsets,
    KafkaWireError,
    list_offsets_request,
    metadata_request,
    parse_list_offsets,
    parse_metadata,
)


def header_and_body(frame: bytes) -> tuple[int, int, int, str, bytes]:
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    api_key, version, correlation, n = struct.unpack_from(">hhih", frame, 4)
    client = frame[14 : 14 + n].decode()
    return api_key, version, correlation, client, frame[14 + n :]


def answer(body: bytes) -> bytes:
    return struct.pack(">i", _CORRELATION) + body


def test_the_list_offsets_request_is_what_aiokafka_reads_as_one() -> None:
    frame = list_offsets_request([("b", 1), ("a", 0), ("a", 3)], "eventbus-doorbell")
    api_key, version, correlation, client, body = header_and_body(frame)
    assert (api_key, version, correlation, client) == (2, 1, _CORRELATION, "eventbus-doorbell")
    request = OffsetRequest_v1.decode(body)
    assert request.replica_id == -1
    assert [(t, [tuple(p) for p in parts]) for t, parts in request.topics] == [
        ("a", [(0, -1), (3, -1)]),
        ("b", [(1, -1)]),
    ]


def test_the_metadata_request_names_the_topics_and_creates_none() -> None:
    api_key, version, _, _, body = header_and_body(metadata_request(["t2", "t1", "t2"], "x"))
    assert (api_key, version) == (3, 4)
    request = MetadataRequest_v4.decode(body)
    assert request.topics == ["t1", "t2"] and request.allow_auto_topic_creation is False


def test_list_offsets_answers_are_parsed_and_errors_reported() -> None:
    body = OffsetResponse_v1([("a", [(0, 0, -1, 17), (1, 6, -1, -1)]), ("b", [(2, 0, -1, 0)])])
    ends, errors = parse_list_offsets(answer(body.encode()))
    assert ends == {"a[0]": 17, "b[2]": 0}
    assert errors, "partition a[1] answered NOT_LEADER: the leaders are asked again"
    ends, errors = parse_list_offsets(answer(OffsetResponse_v1([("a", [(0, 0, -1, 5)])]).encode()))
    assert ends == {"a[0]": 5} and not errors


def test_metadata_answers_give_brokers_and_leaders() -> None:
    body = MetadataResponse_v4(
        0,
        [(1, "10.0.0.1", 9092, None), (2, "10.0.0.2", 9093, "r1")],
        "cluster",
        1,
        [
            (0, "a", False, [(0, 0, 1, [1, 2], [1]), (0, 1, 2, [2], [2]), (5, 2, -1, [], [])]),
            (3, "gone", False, []),
        ],
    ).encode()
    brokers, leaders = parse_metadata(answer(body))
    assert brokers == {1: ("10.0.0.1", 9092), 2: ("10.0.0.2", 9093)}
    assert leaders == {("a", 0): 1, ("a", 1): 2}  # a[2] has no leader: not looked at


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (b"", "truncated"),
        (answer(b"\x00\x00\x00\x01\x00\x05ab"), "truncated"),  # a string cut short
        (answer(b"\x7f\xff\xff\xff"), "malformed"),  # 2**31 topics in 8 bytes
        # one topic claiming 1,000 partitions (fits the byte count, not 22 bytes each)
        (answer(b"\x00\x00\x00\x01\x00\x01t\x00\x00\x03\xe8" + b"\x00" * 1500), "1000 partitions"),
        # a partition cut short
        (answer(b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01" + b"\x00" * 21), "truncated"),
        (struct.pack(">i", 7) + b"\x00\x00\x00\x00", "another request"),
    ],
)
def test_hostile_list_offsets_answers_are_refused(body: bytes, expect: str) -> None:
    with pytest.raises(KafkaWireError, match=expect):
        parse_list_offsets(body)


class OneAnswer:
    """A loopback socket server that reads one request and sends ``reply`` (then holds)."""

    def __init__(self, reply: bytes) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.reply = reply
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(self.reply)
            self.done.wait(10)

    def close(self) -> None:
        self.done.set()
        self.thread.join(10)
        self.server.close()


@pytest.mark.parametrize(
    ("reply", "expect"),
    [
        (struct.pack(">i", 2**30), "1073741824 bytes"),  # an absurd frame size: not read
        (struct.pack(">i", 100) + b"\x00" * 10, "closed|timed out"),  # the answer never ends
    ],
)
def test_an_absurd_or_endless_answer_fails_fast_and_drops_the_connection(
    reply: bytes, expect: str
) -> None:
    server = OneAnswer(reply)
    look = EndOffsets(f"127.0.0.1:{server.port}", timeout_s=0.5)
    try:
        with pytest.raises(OSError, match=expect):
            look.ends([("a", 0)])
        assert look._socks == {}, "the connection that failed was kept"
    finally:
        server.close()
        look.close()


def test_an_unreachable_broker_is_an_error_not_a_hang() -> None:
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    look = EndOffsets(f"127.0.0.1:{port}", timeout_s=0.5)
    with pytest.raises(OSError):
        look.ends([("a", 0)])
    assert look.ends([]) == {}
