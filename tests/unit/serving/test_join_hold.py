"""Whether the controller opens join bridges: only on a broker that holds a first JoinGroup,
told by the cluster id it reports (Tansu's default); asked once, and a broker that does not
answer means no bridge (asked again next time) rather than a wake-up that waits."""

from __future__ import annotations

import socket
import time

import pytest

from eventbus.serving import _bridge
from eventbus.serving._bridge import TANSU_CLUSTER_ID, JoinHold


@pytest.mark.parametrize(
    ("cluster_id", "held"), [(TANSU_CLUSTER_ID, True), ("MkU3OEVBNTcwNTJENDM2Qk", False)]
)
def test_only_tansu_holds_joins_and_it_is_asked_once(
    monkeypatch: pytest.MonkeyPatch, cluster_id: str, held: bool
) -> None:
    asked: list[str] = []

    async def cluster_id_of(bootstrap: str, client: object) -> str:
        asked.append(bootstrap)
        return cluster_id

    monkeypatch.setattr(_bridge, "_cluster_id", cluster_id_of)
    hold = JoinHold("127.0.0.1:9092", None)
    assert hold.held() is held and hold.held() is held
    assert asked == ["127.0.0.1:9092"]


def test_a_broker_that_does_not_answer_means_no_bridge_and_is_asked_again() -> None:
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    hold = JoinHold(f"127.0.0.1:{port}", None)
    started = time.monotonic()
    assert hold.held() is False
    assert time.monotonic() - started < 5.0
    assert hold._held is None, "a failed look was remembered"
