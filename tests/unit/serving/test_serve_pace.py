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


#: the idle pace in the test: far longer than any wait below, so a round that comes during it
#: means the idle sleep was cut (busy) or never taken (a deployment)
IDLE_S = 60.0


async def _until(cond: Any, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def test_idle_slows_the_rounds_a_deployment_or_busy_brings_the_pace_back(serve_module: Any) -> None:
    ctl = _Controller()

    async def scenario() -> dict[str, Any]:
        stop = asyncio.Event()
        task = asyncio.create_task(_loop(serve_module, ctl, stop))
        out: dict[str, Any] = {}
        out["busy"] = await _until(lambda: len(ctl.rounds) >= 10)
        assert pace(ctl, True, IDLE_S) == "idle"
        await asyncio.sleep(0.02)  # the round under way ends; the next sleep is the idle one
        n = len(ctl.rounds)
        await asyncio.sleep(0.5)  # an absence: ~50 rounds at the usual pace
        out["idle"] = len(ctl.rounds) - n
        n = len(ctl.rounds)
        assert pace(ctl, False) == "busy"  # cuts the idle sleep under way
        out["woke"] = await _until(lambda: len(ctl.rounds) > n)
        assert pace(ctl, True, IDLE_S) == "idle"
        ctl.deployment_state_manager._deployment_states["app"] = object()  # someone's app
        n = len(ctl.rounds)
        out["paced_with_a_deployment"] = await _until(lambda: len(ctl.rounds) >= n + 8)
        stop.set()
        pace(ctl, False)  # cut an idle sleep that may have begun, so the loop ends
        await task
        return out

    out = asyncio.run(scenario())
    assert out["busy"], out
    assert out["idle"] <= 1, f"no deployment: one idle round in 0.5 s at most ({out})"
    assert out["woke"], f"busy did not cut the {IDLE_S:g} s idle sleep ({out})"
    assert out["paced_with_a_deployment"], f"a deployment keeps the usual pace ({out})"
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
