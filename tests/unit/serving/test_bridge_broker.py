"""Whether the controller opens join bridges: only on a broker that holds a first JoinGroup
(Tansu, by its cluster id, asked once per process); a broker that does not answer means no
bridge, quickly, rather than a wake-up that waits."""

from __future__ import annotations

import socket
import time

import pytest

from eventbus.eventing import _broker
from eventbus.serving._bridge import broker_holds_joins


@pytest.mark.parametrize("tansu", [True, False])
def test_only_tansu_holds_joins(monkeypatch: pytest.MonkeyPatch, tansu: bool) -> None:
    monkeypatch.setitem(_broker._known, "127.0.0.1:9", tansu)  # what its cluster id said
    assert broker_holds_joins("127.0.0.1:9", None) is tansu


def test_a_broker_that_does_not_answer_means_no_bridge_and_is_asked_again() -> None:
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    started = time.monotonic()
    assert broker_holds_joins(f"127.0.0.1:{port}", None) is False
    assert time.monotonic() - started < 5.0
    assert f"127.0.0.1:{port}" not in _broker._known, "a failed look was remembered"
