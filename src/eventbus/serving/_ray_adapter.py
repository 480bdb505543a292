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
"""

from __future__ import annotations

from typing import Any

__all__ = ["PINNED_RAY", "by_value", "fixed_version"]

#: the Ray version these names were checked against
PINNED_RAY = "2.60.0"


def fixed_version(deployment: Any, version: str, **options: Any) -> Any:
    """``deployment.options(version=version, **options)``: the same version on every deploy,
    so a change of ``user_config`` alone reconfigures the running replicas."""
    return deployment.options(version=version, _internal=True, **options)


def by_value(handle: Any) -> Any:
    """``handle`` with its calls sent by value over gRPC (see the module's docstring)."""
    return handle.options(_by_reference=False)
