"""A model replica following a shadow setting, without a cluster: a replica
(:class:`ModelDeployment` in this process) on a real Redis registry. Rows answered once the
replica followed the setting are all mirrored (the command waits for that, so a user's first
calls after `eventbus model shadow` are compared), and a re-run of an experiment of the same
version starts from zero: the previous run's last counters never land in it."""

from __future__ import annotations

import io
import threading
import time
import uuid
from typing import Any

import numpy as np
import pytest
import torch

from eventbus.models import ModelRegistry
from eventbus.models._live import ShadowMirror
from eventbus.models._serve import ModelDeployment

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


class _Flip(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(1)


def _artifact(module: torch.nn.Module) -> bytes:
    ep = torch.export.export(
        module, (torch.randn(2, 2),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


@pytest.fixture
def model(redis_url: str) -> tuple[ModelRegistry, str]:
    reg = ModelRegistry(redis_url)
    name = f"sh-{uuid.uuid4().hex[:8]}"
    reg.add_version(name, _artifact(torch.nn.Identity()), format="export")
    reg.add_version(name, _artifact(_Flip()), format="export")
    reg.set_serving(name, 1)
    return reg, name


def _until(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.05)  # polling the registry for a condition
    return value


def test_rows_answered_after_the_replica_followed_are_all_mirrored(
    model: tuple[ModelRegistry, str], redis_url: str
) -> None:
    reg, name = model
    replica = ModelDeployment(name, redis_url, {})
    try:
        assert replica.info()["shadow"] is None
        setting = reg.set_shadow(name, 2, 1.0)["shadow"]
        info = replica.follow()  # what `eventbus model shadow` waits for
        assert info["shadow"]["version"] == 2 and info["shadow"]["share"] == 1.0
        assert info["shadow"]["started_at"] == setting["started_at"]
        x = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 3.0]], dtype=np.float32)
        [(y, versions)] = replica._infer([(x, None)])  # the very next call, answered by v1
        assert y.tolist() == x.tolist() and versions.tolist() == [1, 1, 1]

        def compared() -> Any:
            c = reg.comparison(name, 2)
            return c if c and c["rows"] + c["dropped_rows"] + c["error_rows"] >= 3 else None

        c = _until("the first call's comparison", compared)
        assert c["rows"] == 3 and c["calls"] == 1 and c["agreement"] == 0.0
        reg.set_shadow(name, None)
        assert replica.follow()["shadow"] is None
    finally:
        replica.__del__()


def test_a_rerun_of_the_same_version_starts_from_zero(
    model: tuple[ModelRegistry, str], redis_url: str
) -> None:
    reg, name = model
    replica = ModelDeployment(name, redis_url, {})
    try:
        first = reg.set_shadow(name, 2, 0.5)["shadow"]
        assert replica.follow()["shadow"]["started_at"] == first["started_at"]
        again = reg.set_shadow(name, 2, 0.5)["shadow"]  # the same version and share, re-run
        assert again["started_at"] != first["started_at"]
        assert replica.follow()["shadow"]["started_at"] == again["started_at"]
    finally:
        replica.__del__()

    # a replica's last flush of the first run, after the re-run started, is let go
    stale = ShadowMirror(name, 2, lambda t: t, share=1.0, started_at=first["started_at"])
    stale.comparison.compare(np.ones((4, 2)), np.ones((4, 2)))
    stale.flush(reg)
    stale.stop()
    assert reg.comparison(name, 2)["rows"] == 0
    current = ShadowMirror(name, 2, lambda t: t, share=1.0, started_at=again["started_at"])
    current.comparison.compare(np.ones((4, 2)), np.ones((4, 2)))
    current.flush(reg)
    current.stop()
    assert reg.comparison(name, 2)["rows"] == 4
