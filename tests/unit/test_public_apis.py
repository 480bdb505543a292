"""``src/`` uses only public names of other packages (issue 43): no import from a private
module (``ray.serve._private``), no underscored name imported or read from another package's
module (``re2._re2``), no underscored keyword argument (``_internal=True``,
``_by_reference=False``), no ``__ray_call__``, and no attribute of another package's object
read by an underscored name through a well-known handle (``consumer._client``,
``._coordinator``). What has no public way lives in one adapter module per library
(``*_adapter.py``), each with a test that fails on an upgrade; generated gRPC stubs are
grpcio-tools' code."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "eventbus"
#: adapter modules (one per library) and generated code
ALLOWED = ("_adapter.py", "_pb2.py", "_pb2_grpc.py", "_pb2.pyi")
#: attributes of other packages' objects that were read through privates before (issue 43)
KNOWN_PRIVATE = {"_client", "_coordinator", "_fetcher", "_fetcher_timeout", "_fetch_max_wait_ms"}
#: underscored names the standard library documents as public
STDLIB_PUBLIC = {"os._exit", "sys._getframe"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    foreign: set[str] = set()  # names bound to another package's module
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("eventbus"):
                    foreign.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("eventbus") or node.module == "__future__":
                continue
            if any(_private(part) for part in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (
                isinstance(base, ast.Name)
                and base.id in foreign
                and _private(node.attr)
                and f"{base.id}.{node.attr}" not in STDLIB_PUBLIC
            ):
                found.append(f"{node.lineno}: {base.id}.{node.attr}")
            elif node.attr == "__ray_call__":
                found.append(f"{node.lineno}: .__ray_call__")
            elif node.attr in KNOWN_PRIVATE and not (
                isinstance(base, ast.Name) and base.id in ("self", "cls")
            ):
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg is not None and _private(kw.arg):
                    found.append(f"{node.lineno}: keyword {kw.arg}=")
    return found


def test_src_uses_no_private_name_of_another_package_outside_its_adapter() -> None:
    offences = {
        str(path.relative_to(SRC)): found
        for path in sorted(SRC.rglob("*.py"))
        if not path.name.endswith(ALLOWED) and (found := _violations(path))
    }
    assert not offences, (
        "private names of other packages outside the adapter modules (use a public API, or "
        f"move the use into that library's *_adapter.py with a test that fails on an upgrade): "
        f"{offences}"
    )


def test_the_check_catches_what_it_is_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import re2\n"
        "from ray.serve._private.constants import X\n"
        "from aiokafka import _private_thing\n"
        "rx = re2._re2.RE2\n"
        "h.options(_by_reference=False)\n"
        "actor.__ray_call__.remote(f)\n"
        "consumer._client.force_metadata_update()\n"
        "self._client = 1\n",
        encoding="utf-8",
    )
    found = _violations(sample)
    assert sorted(int(f.split(":")[0]) for f in found) == [2, 3, 4, 5, 6, 7], found
