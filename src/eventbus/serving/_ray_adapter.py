"""Ray Serve's non-public options that EventBus uses, in one place (``ray[serve]==2.60.0``,
pinned in ``pyproject.toml``; ``tests/unit/serving/test_ray_adapter.py`` fails on an upgrade
that changes them).

- :func:`fixed_version`: a deployment with a version EventBus chooses. Serve reconfigures the
  running replicas (``reconfigure(user_config)``) instead of replacing them when only the
  ``user_config`` changes between two ``serve.run`` calls, but only for a deployment whose
  version stays the same; ``serve.run`` otherwise gives every deploy a new random code
  version, and Serve's ``Deployment.options`` takes ``version`` only with ``_internal=True``.
  A shared host (``serving/_host.py``) changes its membership this way without restarting the
  other members.
- :func:`by_value`: a ``DeploymentHandle`` whose calls travel by value over the replica's
  gRPC server, not through the object store (``_by_reference=False``): one round trip
  instead of a put, a call and a get, ~1.6x the requests a second of the gateway's
  synchronous calls. Ray has no public option for it (only the test-only environment
  variable ``RAY_SERVE_USE_GRPC_BY_DEFAULT`` that flips every handle of the process).
- :func:`set_serve_pace`: Serve's control loop at a slow pace while no application runs on
  Serve (below). Ray has no public setting for the pace of a running controller:
  ``RAY_SERVE_CONTROL_LOOP_INTERVAL_S`` is read once when Serve starts and would slow every
  deploy and wake-up as well.

Serve's control loop pace
-------------------------

Serve's controller runs a control round every ``RAY_SERVE_CONTROL_LOOP_INTERVAL_S`` (0.2 s in
the embedded stack) whether or not it holds an application: each round asks the GCS for the
cluster's nodes, their resources and the draining ones. With every pipeline at zero (their
applications are deleted, ``_scale_to_zero``) that was the largest part of what idle costs
above the stack's own: Serve's controller ~0.45% of a core for its rounds and the GCS ~0.4%
answering them (``benchmarks/idle.py``, 50 pipelines at zero).

So when the last application is gone the EventBus controller asks Serve's controller, through
Ray's ``__ray_call__`` (a closure run on the actor), to sleep :data:`IDLE_PACE_S` between
rounds, and before it runs an application again (a deploy, a wake-up from zero, a restore) to
go back to its pace at once, cutting the sleep under way, so a cold start waits for no slow
round. The slow pace holds only while Serve's controller has no deployment at all (checked at
each round): an application run by anyone else brings the usual pace back by the next round.

How: Serve's control loop sleeps with ``asyncio.sleep`` looked up in its module's globals
(``ray.serve._private.controller``, Ray 2.60); the closure puts there a stand-in for the
``asyncio`` module whose ``sleep`` can be cut short and which hands every other name to the
real one. Anything unexpected (another Ray version without those names, a controller that
restarted and lost the stand-in) leaves Serve's pace as it is: :func:`pace` answers
``"unsupported"`` and nothing changes.

This module is pickled by value into Serve's controller (it imports nothing of EventBus).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["IDLE_PACE_S", "PINNED_RAY", "by_value", "fixed_version", "pace", "set_serve_pace"]

#: the Ray version these names were checked against
PINNED_RAY = "2.60.0"


def fixed_version(deployment: Any, version: str, **options: Any) -> Any:
    """``deployment.options(version=version, **options)``: the same version on every deploy,
    so a change of ``user_config`` alone reconfigures the running replicas."""
    return deployment.options(version=version, _internal=True, **options)


def by_value(handle: Any) -> Any:
    """``handle`` with its calls sent by value over gRPC (see the module's docstring)."""
    return handle.options(_by_reference=False)


#: Serve's control loop pace while no application runs on it.
IDLE_PACE_S = 2.0
_MODULE = "ray.serve._private.controller"


def pace(controller: Any, idle: bool, idle_s: float = IDLE_PACE_S) -> str:
    """Run in Serve's controller process (``__ray_call__``): set its control loop's pace.

    Args:
        controller: the ``ServeController`` actor instance.
        idle: True: sleep ``idle_s`` between rounds while no deployment exists; False: the
            usual pace, starting with a round now.
        idle_s: the idle pace.

    Returns:
        ``"idle"``, ``"busy"``, or ``"unsupported"`` (nothing changed).
    """
    import asyncio

    module = sys.modules.get(_MODULE)
    if module is None or not isinstance(getattr(module, "CONTROL_LOOP_INTERVAL_S", None), float):
        return "unsupported"
    stand_in: Any = getattr(module, "asyncio", None)
    if not getattr(stand_in, "eventbus_pace", False):
        if stand_in is not asyncio or not hasattr(controller, "deployment_state_manager"):
            return "unsupported"
        stand_in = _PacedAsyncio(asyncio, controller)
        setattr(module, "asyncio", stand_in)  # noqa: B010 - the controller module's global
    stand_in.set(idle, idle_s)
    return "idle" if idle else "busy"


class _PacedAsyncio:
    """``asyncio`` as Serve's controller module sees it: a ``sleep`` that stretches to the
    idle pace and can be cut short; every other name is the real module's."""

    eventbus_pace = True

    def __init__(self, real: Any, controller: Any) -> None:
        self._real = real
        self._controller = controller
        self.idle = False
        self.idle_s = 0.0
        self._cut: tuple[Any, Any] | None = None  # (loop, event) of the idle sleep under way

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def set(self, idle: bool, idle_s: float) -> None:
        self.idle, self.idle_s = idle, idle_s
        cut = self._cut
        if not idle and cut is not None:
            loop, event = cut
            loop.call_soon_threadsafe(event.set)

    async def sleep(self, delay: float, result: Any = None) -> Any:
        if not self.idle or delay >= self.idle_s or self._has_deployments():
            return await self._real.sleep(delay, result)
        event = self._real.Event()
        self._cut = (self._real.get_running_loop(), event)
        try:
            if self.idle:  # not set busy meanwhile (set() reads _cut after the flag)
                await self._real.wait_for(event.wait(), self.idle_s)
        except TimeoutError:
            pass
        finally:
            self._cut = None
        return result

    def _has_deployments(self) -> bool:
        try:
            return bool(self._controller.deployment_state_manager._deployment_states)
        except Exception:  # noqa: BLE001 - another Serve: keep its pace
            return True


def set_serve_pace(idle: bool) -> str:
    """From the EventBus controller: set Serve's control loop pace (:func:`pace`).

    Raises:
        Exception: Serve's controller could not be reached (callers log it and go on).
    """
    import ray
    from ray import cloudpickle
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    handle = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    return str(ray.get(handle.__ray_call__.remote(pace, idle), timeout=10))
