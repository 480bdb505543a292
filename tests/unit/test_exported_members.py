"""The public surface: sorted __all__ equals the public names (httpx's test)."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "eventbus",
    "eventbus.pipelines",
    "eventbus.functions",
    "eventbus.eventing",
    "eventbus.errors",
    "eventbus.cel",
    "eventbus.cesql",
    "eventbus.jsonata",
    "eventbus.solver",
    "eventbus.eventing.sources",
    "eventbus.models",
    "eventbus.observability",
    "eventbus.registry",
    "eventbus.testing",
    "eventbus.gateway",
    "eventbus.schemas",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_complete(name: str) -> None:
    mod = importlib.import_module(name)
    exported = list(mod.__all__)
    assert exported == sorted(exported), f"{name}.__all__ is not sorted"
    for attr in exported:
        assert hasattr(mod, attr), f"{name}.{attr} is in __all__ but missing"
    public = {
        n
        for n, v in vars(mod).items()
        if not n.startswith("_")
        and getattr(v, "__module__", "").startswith(name)
        and not isinstance(v, type(importlib))
    }
    assert public <= set(exported), (
        f"{name} has public names missing from __all__: {sorted(public - set(exported))}"
    )


def test_import_eventbus_does_not_import_ray() -> None:
    import subprocess
    import sys

    code = "import sys, eventbus, eventbus.pipelines; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
