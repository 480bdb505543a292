"""The fenced code blocks of README.md and the docs site's pages, for the tests that run them.

A block may be preceded by an HTML comment that tells the tests what to do with it:
``<!-- docs-test: skip REASON -->`` (an abridged or non-pipeline block), ``<!-- docs-test:
run -->`` (a Python block executed as it is), ``<!-- docs-test: same-as PATH -->`` (a YAML
block that must equal a file of the repository, parsed), ``<!-- docs-test: fragment -->`` (a
YAML block that is part of a pipeline: its steps, or some of its spec's keys; validated inside
a minimal pipeline, where an unmarked YAML block must be a whole one). The tutorials' marks
are in ``tutorial.py``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)
_MARK = re.compile(r"<!-- docs-test: (?P<what>[\w-]+) ?(?P<arg>[^>]*?) ?-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its text, its docs-test mark."""

    path: Path
    line: int
    lang: str
    text: str
    mark: str = ""
    mark_arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every Markdown page of the site (the generated reference is built)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(lang: str | None = None) -> list[Block]:
    """Every fenced block of the pages, in order; only those of ``lang`` when given."""
    found = []
    for path in pages():
        text = path.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before)
            indent = len(m["indent"])
            body = "\n".join(line[indent:] for line in m["body"].splitlines()) + "\n"
            block = Block(
                path=path,
                line=text.count("\n", 0, m.start()) + 1,
                lang=m["lang"],
                text=body,
                mark=mark["what"] if mark else "",
                mark_arg=mark["arg"].strip() if mark else "",
            )
            if lang is None or block.lang == lang:
                found.append(block)
    return found


def docs_hook(name: str) -> ModuleType:
    """One of the site's build hooks (``docs/<name>.py``), imported from its file."""
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and typing look their module up
    spec.loader.exec_module(module)
    return module
