"""The registry's records of live experiments on a real Redis (no Ray): concurrent rollbacks
switch once, comparison counters from several replicas merge, bad shadow settings are refused,
the history is bounded and shows what it cannot read."""

from __future__ import annotations

import threading
import uuid

import pytest

from eventbus._internal import keys
from eventbus._internal.redis_client import connect
from eventbus.errors import ModelError
from eventbus.models import ModelRegistry
from eventbus.models._compare import Comparison

pytestmark = [pytest.mark.integration, pytest.mark.redis]


def _registry(redis_url: str) -> tuple[ModelRegistry, str]:
    reg = ModelRegistry(redis_url)
    name = f"x-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        reg.add_version(name, b"artifact", format="export")
    reg.set_serving(name, 1)
    reg.set_serving(name, 2)
    return reg, name


def test_concurrent_rollbacks_switch_once(redis_url: str) -> None:
    reg, name = _registry(redis_url)
    wins: list[bool] = []
    start = threading.Barrier(8)

    def roll() -> None:
        start.wait()
        wins.append(
            reg.rollback(name, kind="serving", bad=2, to=1, reason="error rate", figures={})
        )

    threads = [threading.Thread(target=roll) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]
    st = reg.state(name)
    assert st["serving"] == 1 and reg.rolled_back(name, 2) and not reg.rolled_back(name, 1)
    assert (
        reg.record(name, 2)["status"] == "rolled-back"
        and reg.record(name, 1)["status"] == "serving"
    )
    assert "rolled back to version 1: error rate" in reg.record(name, 2)["error"]
    [entry] = [h for h in reg.history(name) if h["kind"] == "rollback"]
    assert entry["version"] == 2 and entry["to"] == 1
    # a split that is no longer there is not rolled back; one that is, ends
    assert not reg.rollback(name, kind="split", bad=3, to=1, reason="r", figures={})
    reg.set_split(name, 3, 0.5)
    assert reg.rollback(name, kind="split", bad=3, to=1, reason="r", figures={})
    assert reg.state(name)["split"] is None and reg.state(name)["serving"] == 1


def test_shadow_settings_comparisons_and_history(redis_url: str) -> None:
    reg, name = _registry(redis_url)
    for version, share, match in (
        (2, 0.2, "already serves"),
        (7, 0.2, "has no version 7"),
        (3, 1.5, r"outside \(0, 1\]"),
        (3, float("inf"), r"outside \(0, 1\]"),
    ):
        with pytest.raises(ModelError, match=match):
            reg.set_shadow(name, version, share)
    before = reg.state(name)["revision"]
    reg.set_shadow(name, 3, 0.25)
    assert reg.state(name)["shadow"]["version"] == 3 and reg.state(name)["revision"] > before

    def replica() -> None:  # each flushes its own counters, as replicas do
        c = Comparison()
        for _ in range(50):
            c.compare([[1.0, 0.0]], [[0.0, 1.0]])
            ints, abs_sum = c.take()
            reg.add_comparison(name, 3, ints, abs_sum)

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fig = reg.comparison(name, 3)
    assert fig is not None and fig["rows"] == 200 and fig["agreement"] == 0.0
    assert fig["mad"] == pytest.approx(1.0) and fig["share"] == 0.25 and fig["version"] == 3
    reg.set_shadow(name, None)
    assert reg.state(name)["shadow"] is None and "stopped_at" in (reg.comparison(name, 3) or {})
    reg.set_shadow(name, 3, 0.5)  # a new experiment starts from zero
    assert (reg.comparison(name, 3) or {})["rows"] == 0
    reg.set_serving(name, 3)  # serving ends its shadow
    assert reg.state(name)["shadow"] is None

    # a record no writer of ours makes: shown, not skipped
    connect(redis_url).lpush(keys.model_history(name), b"{not json")
    kinds = [h["kind"] for h in reg.history(name)]
    assert kinds[0] == "unreadable" and "shadow-start" in kinds and "shadow-stop" in kinds
    for _ in range(250):
        reg.set_shadow(name, 1, 0.1)
    assert len(reg.history(name, limit=1000)) == 200
