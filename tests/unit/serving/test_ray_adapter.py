"""The non-public Ray Serve options ``serving/_ray_adapter.py`` uses still exist and still do
what it relies on: this fails loudly on a Ray upgrade that renames or drops one."""

from __future__ import annotations

import inspect
from importlib.metadata import version

import pytest
from ray import serve
from ray.serve.handle import DeploymentHandle

from eventbus.serving._ray_adapter import PINNED_RAY, by_value, fixed_version


def test_the_pinned_version_is_installed() -> None:
    assert version("ray") == PINNED_RAY, (
        "Ray was upgraded: check serving/_ray_adapter.py's two options against the new "
        "version, then update PINNED_RAY and pyproject's pin"
    )


def test_serve_takes_a_version_only_through_the_adapter() -> None:
    @serve.deployment
    class D:
        pass

    # Serve refuses a user's version: the reason the adapter exists (if this stops raising,
    # the public way works and the adapter can go)
    with pytest.raises(ValueError, match="version"):
        D.options(version="v1")
    fixed = fixed_version(D, "eventbus-test-1", num_replicas=2)
    assert fixed.version == "eventbus-test-1"
    assert fixed.num_replicas == 2


def test_handles_still_take_by_reference() -> None:
    assert "_by_reference" in inspect.signature(DeploymentHandle.options).parameters

    class Handle:
        def options(self, **kwargs: object) -> dict[str, object]:
            return kwargs

    assert by_value(Handle()) == {"_by_reference": False}


def test_serve_controller_still_has_what_the_pace_replaces() -> None:
    """:func:`pace` answers "unsupported" and does nothing on a Serve without these; this
    names the change instead of letting the idle pace go quietly."""
    from ray.serve._private import controller
    from ray.serve._private.deployment_state import DeploymentStateManager

    assert isinstance(controller.CONTROL_LOOP_INTERVAL_S, float)
    assert controller.asyncio.__name__ == "asyncio"
    source = inspect.getsource(controller.ServeController)
    assert "asyncio.sleep" in source and "self.deployment_state_manager" in source
    assert "self._deployment_states" in inspect.getsource(DeploymentStateManager.__init__)
