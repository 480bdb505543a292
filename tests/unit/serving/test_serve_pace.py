"""Serve's control loop pace while no application runs (``serving/_ray_adapter.py``), against a
stand-in of Serve's controller module that loops as Serve's does (``asyncio.sleep`` looked up
in its module's globals each round); the real one: ``tests/integration/test_scale_to_zero.py``."""

from __future__ import annotations

import asyncio
import sys
import time
import types
from typing import Any

import pytest

from eventbus.serving._ray_adapter import pace


class _Controller:
    def __init__(self) -> None:
        self.deployment_state_manager = types.SimpleNamespace(_deployment_states={})
        self.rounds: list[float] = []


@pytest.fixture
def serve_module() -> Any:
    module = types.ModuleType("ray.serve._private.controller")
    module.CONTROL_LOOP_INTERVAL_S = 0.01  # type: ignore[attr-defined]
    module.asyncio = asyncio  # type: ignore[attr-defined]
    saved = sys.modules.get(module.__name__)
    sys.modules[module.__name__] = module
    yield module
    if saved is None:
        del sys.modules[module.__name__]
    else:
        sys.modules[module.__name__] = saved


async def _loop(module: Any, ctl: _Controller, stop: asyncio.Event) -> None:
    """Serve's run_control_loop, reduced to its pace."""
    while not stop.is_set():
        ctl.rounds.append(time.monotonic())
        await module.asyncio.sleep(module.CONTROL_LOOP_INTERVAL_S)


def test_idle_slows_the_rounds_a_deployment_or_busy_brings_the_pace_back(serve_module: Any) -> None:
    ctl = _Controller()

    async def scenario() -> dict[str, Any]:
        stop = asyncio.Event()
        task = asyncio.create_task(_loop(serve_module, ctl, stop))
        out: dict[str, Any] = {}
        await asyncio.sleep(0.2)
        out["busy"] = len(ctl.rounds)
        assert pace(ctl, True, 0.5) == "idle"
        await asyncio.sleep(0.02)  # the round under way ends; the next sleep is the idle one
        n = len(ctl.rounds)
        await asyncio.sleep(0.3)
        out["idle"] = len(ctl.rounds) - n
        t = time.monotonic()
        assert pace(ctl, False) == "busy"  # cuts the idle sleep under way
        await asyncio.sleep(0.05)
        out["woke_after_s"] = next((r - t for r in ctl.rounds if r >= t), None)
        assert pace(ctl, True, 0.5) == "idle"
        ctl.deployment_state_manager._deployment_states["app"] = object()  # someone's app
        await asyncio.sleep(0.6)
        n = len(ctl.rounds)
        await asyncio.sleep(0.2)
        out["idle_with_a_deployment"] = len(ctl.rounds) - n
        stop.set()
        await task
        return out

    out = asyncio.run(scenario())
    assert out["busy"] >= 10, out
    assert out["idle"] <= 1, f"no deployment: one idle round in 0.3 s at most ({out})"
    assert out["woke_after_s"] is not None and out["woke_after_s"] < 0.03, out
    assert out["idle_with_a_deployment"] >= 8, f"a deployment keeps the usual pace ({out})"
    # the stand-in hands every other name to asyncio
    assert serve_module.asyncio.Event is asyncio.Event and serve_module.asyncio.eventbus_pace


def test_an_unknown_serve_is_left_as_it_is(serve_module: Any) -> None:
    del serve_module.CONTROL_LOOP_INTERVAL_S  # another Ray version
    assert pace(_Controller(), True) == "unsupported"
    assert serve_module.asyncio is asyncio
    serve_module.CONTROL_LOOP_INTERVAL_S = 0.01
    assert pace(object(), True) == "unsupported", "a controller without its deployment state"
    assert serve_module.asyncio is asyncio
    del sys.modules[serve_module.__name__]
    assert pace(_Controller(), True) == "unsupported"
    sys.modules[serve_module.__name__] = serve_module
