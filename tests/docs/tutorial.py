"""A tutorial page as a script: its shell blocks in order, the files it tells the reader to
save, and the output it says the reader will see; and the matcher that checks that output.

The marks (the HTML comment on the line before a fence, as in ``blocks.py``):

- ``<!-- docs-test: output -->`` on a ``text`` block: what the shell block before it prints
  (stdout and stderr, as a terminal shows them). ``...`` in a line matches anything in it; a
  line of only ``...`` matches any number of lines; runs of blanks count as one, so do runs
  of a table's rule characters (``━``, ``─``), and blank lines are ignored. The block is the
  whole output: line for line, in this order, except where a ``...`` line stands (so a new
  warning fails the page until the page shows it).
- ``<!-- docs-test: output unordered -->``: per record (a record starts at each line that
  begins with a letter), each record somewhere in the output, in any order.
- ``<!-- docs-test: output background -->``: what the background block (below) has printed
  by now, as with ``unordered``; the test waits for it.
- ``<!-- docs-test: file NAME -->`` on a YAML or Python block: the reader saves it as NAME.
- ``<!-- docs-test: background -->`` on a shell block: the reader runs it in a second
  terminal; it keeps running until the tutorial ends.
- ``<!-- docs-test: skip REASON -->`` on a shell block: not run (installing, say).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.docs.blocks import Block, blocks

SHELL_LANGS = ("bash", "sh", "shell", "console")


@dataclass
class Step:
    """One thing the reader does: run a shell block, start one in the background, or save a
    file; with the output the page says they will see."""

    kind: str  # "shell", "background", "file", "await" (the background's output so far)
    block: Block
    name: str = ""  # the file's name (kind "file")
    expected: str | None = None
    unordered: bool = False


def steps(page: Path) -> list[Step]:
    """The page's steps in order; an output block attaches to the shell block before it."""
    out: list[Step] = []
    for block in (b for b in blocks() if b.path == page):
        if block.mark == "output":
            args = block.mark_arg.split()
            if "background" in args:
                out.append(Step("await", block, expected=block.text))
                continue
            assert out and out[-1].kind == "shell" and out[-1].expected is None, (
                f"{block.where}: an output block must follow the shell block that prints it"
            )
            out[-1].expected = block.text
            out[-1].unordered = "unordered" in args
        elif block.mark == "file":
            out.append(Step("file", block, name=block.mark_arg))
        elif block.lang in SHELL_LANGS and block.mark != "skip":
            out.append(Step("background" if block.mark == "background" else "shell", block))
    return out


_RULE = re.compile(r"([━─])\1+")


def _norm(text: str) -> list[str]:
    return [_RULE.sub(r"\1", " ".join(line.split())) for line in text.splitlines() if line.strip()]


def _line(expected: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in expected.split("...")))


def _shows(exp: list[str], act: list[str], whole: bool) -> bool:
    """Whether ``act`` is ``exp`` (``whole``) or holds it somewhere: the set of line positions
    each prefix of ``exp`` can end at, one expected line at a time (linear in both, whatever
    the ``...``)."""
    ends = {0} if whole else set(range(len(act) + 1))
    for line in exp:
        if not ends:
            return False
        if line == "...":
            ends = set(range(min(ends), len(act) + 1))
        else:
            pattern = _line(line)
            ends = {j + 1 for j in ends if j < len(act) and pattern.fullmatch(act[j])}
    return len(act) in ends if whole else bool(ends)


def _records(text: str) -> list[str]:
    records: list[list[str]] = []
    for line in text.splitlines():
        if not records or line[:1].isalpha():
            records.append([])
        records[-1].append(line)
    return ["\n".join(r) for r in records]


def mismatch(expected: str, actual: str, unordered: bool = False) -> str | None:
    """None when ``actual`` shows ``expected`` (see the module's rules), else which part of
    ``expected`` it does not show."""
    for part in _records(expected) if unordered else [expected]:
        if not _shows(_norm(part), _norm(actual), whole=not unordered):
            return part
    return None
