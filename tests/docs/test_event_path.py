""" "The path of an event" (docs/concepts/event-path.md) is checked against the code: every
file its table names exists under src/eventbus/, every function it names is defined in one of
its row's files (``Class.method`` as a method of that class), and the walk covers the source,
the decode, the replica, the steps, the sinks and the commit in that order."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.docs.blocks import DOCS, ROOT

PAGE = DOCS / "concepts" / "event-path.md"
SRC = ROOT / "src" / "eventbus"
_CODE = re.compile(r"`([^`]+)`")


def rows() -> list[tuple[int, list[str], list[str]]]:
    """The table after ``<!-- event-path -->``: (step, files, functions) per row."""
    text = PAGE.read_text(encoding="utf-8")
    assert "<!-- event-path -->" in text, f"{PAGE}: the table's marker is gone"
    table = text.split("<!-- event-path -->", 1)[1].strip().split("\n\n", 1)[0]
    out = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"{PAGE}: a row of 4 cells expected: {line!r}"
        out.append((int(cells[0]), _CODE.findall(cells[2]), _CODE.findall(cells[3])))
    return out


@cache
def defined(path: Path) -> frozenset[str]:
    """Top-level functions and classes of ``path``, and ``Class.method`` for their methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return frozenset(names)


ROWS = rows()


def test_the_walk_is_in_order_and_whole() -> None:
    assert [n for n, _, _ in ROWS] == list(range(1, len(ROWS) + 1))
    files = [f for _, fs, _ in ROWS for f in fs]
    order = [
        "serving/_deployment.py",  # the replica
        "eventing/sources/_kafka_fetch.py",  # the source's fetch
        "eventing/_codecs.py",  # decode
        "pipelines/_runner.py",  # the steps
        "eventing/sinks/_kafka.py",  # the sink
        "eventing/sources/_kafka_commit.py",  # the commit
    ]
    assert all(f in files for f in order)
    assert [files.index(f) for f in order] == sorted(files.index(f) for f in order)


@pytest.mark.parametrize(("step", "files", "functions"), ROWS, ids=[str(r[0]) for r in ROWS])
def test_every_file_and_function_named_exists(
    step: int, files: list[str], functions: list[str]
) -> None:
    assert files and functions, f"step {step}: names no file or no function"
    for f in files:
        assert (SRC / f).is_file(), f"step {step}: src/eventbus/{f} does not exist"
    names = set().union(*(defined(SRC / f) for f in files))
    missing = [fn for fn in functions if fn not in names]
    assert missing == [], f"step {step}: not defined in {', '.join(files)}: {missing}"


def test_a_renamed_function_is_caught(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("class A:\n    async def run(self): ...\n\ndef f(): ...\n")
    assert {"A", "A.run", "f"} <= defined(module)
    assert "A.fetch" not in defined(module)
