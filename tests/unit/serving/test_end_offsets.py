"""The ringer's look at partition ends without a broker: its ListOffsets request as aiokafka
builds it for each version it may negotiate, answers of each version read, and a broker that
is away or never answers an error within the look's timeout, never a hang (the look against
the real brokers, plaintext and TLS: tests/integration/test_end_offsets.py)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from aiokafka.protocol.metadata import MetadataResponse_v1, MetadataResponse_v5
from aiokafka.protocol.offset import (
    OffsetRequest_v1,
    OffsetRequest_v3,
    OffsetResponse_v0,
    OffsetResponse_v1,
    OffsetResponse_v3,
)

from eventbus.serving._end_offsets import (
    EndOffsets,
    EndOffsetsError,
    _request,
    leaders_of,
    log_ends_of,
)


@pytest.mark.parametrize("version", [OffsetRequest_v1, OffsetRequest_v3])
def test_one_list_offsets_request_asks_the_latest_offset_of_each_partition(version) -> None:
    built = _request([("b", 1), ("a", 3), ("a", 0)]).build(version)
    again = version.decode(built.encode())  # what the broker reads
    assert again.replica_id == -1
    assert [(t, [tuple(p) for p in parts]) for t, parts in again.topics] == [
        ("a", [(0, -1), (3, -1)]),
        ("b", [(1, -1)]),
    ]
    if version is OffsetRequest_v3:  # the high watermark, as a parked source's fetch sees it
        assert again.isolation_level == 0


def test_list_offsets_answers_of_each_version_are_read_and_errors_reported() -> None:
    v1 = OffsetResponse_v1([("a", [(0, 0, -1, 17), (1, 6, -1, -1)]), ("b", [(2, 0, -1, 0)])])
    ends, errors = log_ends_of(OffsetResponse_v1.decode(v1.encode()))
    assert ends == {"a[0]": 17, "b[2]": 0}
    assert errors, "partition a[1] answered NOT_LEADER: the leaders are asked again"
    v3 = OffsetResponse_v3(0, [("a", [(0, 0, -1, 5)])])
    assert log_ends_of(OffsetResponse_v3.decode(v3.encode())) == ({"a[0]": 5}, False)
    v0 = OffsetResponse_v0([("a", [(0, 0, [9]), (1, 0, [])])])
    assert log_ends_of(OffsetResponse_v0.decode(v0.encode())) == ({"a[0]": 9}, True)


def test_metadata_answers_give_brokers_and_leaders() -> None:
    v5 = MetadataResponse_v5(
        0,
        [(1, "10.0.0.1", 9092, None), (2, "10.0.0.2", 9093, "r1")],
        "cluster",
        1,
        [
            (
                0,
                "a",
                False,
                [(0, 0, 1, [1, 2], [1], []), (0, 1, 2, [2], [2], []), (5, 2, -1, [], [], [])],
            ),
            (3, "gone", False, []),
        ],
    )
    brokers, leaders = leaders_of(MetadataResponse_v5.decode(v5.encode()))
    assert brokers == {1, 2}
    assert leaders == {("a", 0): 1, ("a", 1): 2}  # a[2] has no leader: not looked at
    v1 = MetadataResponse_v1([(1, "h", 9092, None)], 1, [(0, "t", False, [(0, 0, 1, [1], [1])])])
    assert leaders_of(MetadataResponse_v1.decode(v1.encode())) == ({1}, {("t", 0): 1})


class Silent:
    """A loopback server that takes connections and never answers (a hung broker)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.server.close()
        for conn in self.conns:
            conn.close()


def test_a_broker_that_never_answers_is_an_error_within_the_timeout() -> None:
    server = Silent()
    look = EndOffsets(f"127.0.0.1:{server.port}", timeout_s=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(EndOffsetsError):
            look.ends([("a", 0)])
        assert time.monotonic() - started < 3.0
    finally:
        look.close()
        look.close()  # idempotent
        server.close()


def test_an_unreachable_broker_is_an_error_not_a_hang() -> None:
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    look = EndOffsets(f"127.0.0.1:{port}", timeout_s=0.5)
    try:
        with pytest.raises(EndOffsetsError, match=f"127.0.0.1:{port}"):
            look.ends([("a", 0)])
        assert look.ends([]) == {}
    finally:
        look.close()
