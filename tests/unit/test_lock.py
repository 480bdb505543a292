"""``constraints.txt`` (``make lock``) pins every package of the venv that ``make setup`` builds,
and CI installs through it: a release of a library cannot change under a user or under CI
between two runs. This checks the lock against ``pyproject.toml``: every runtime and test
dependency is locked at a version its requirement admits (an added or re-pinned dependency
without ``make lock`` fails here, naming it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not NAME==VERSION (run make lock)"
            pins[canonicalize_name(name)] = version
    return pins


def test_every_dependency_is_locked_at_an_admitted_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = list(project["dependencies"]) + list(project["optional-dependencies"]["test"])
    locked = _locked()
    problems = []
    for spec in wanted:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        if name not in locked:
            problems.append(f"{req.name} is not in constraints.txt")
        elif not req.specifier.contains(locked[name], prereleases=True):
            problems.append(f"{req.name}=={locked[name]} does not satisfy {spec!r}")
    assert not problems, f"{problems}: run `make lock` after changing pyproject's dependencies"


def test_the_project_itself_is_not_locked() -> None:
    locked = _locked()
    assert "eventbus" not in locked and "eventbus-example-plugin" not in locked
