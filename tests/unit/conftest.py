"""Unit tests start nothing: Ray may not be initialised here (Ray's serve/tests/unit)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _disallow_ray_init(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    if "ray" in sys.modules:

        def _raise(*_a: object, **_k: object) -> None:
            msg = "unit tests must not start Ray; move this test to tests/integration"
            raise RuntimeError(msg)

        monkeypatch.setattr(sys.modules["ray"], "init", _raise)
