"""README.md is the front door: short, the two commands first, links that resolve, and a
performance table whose figures are the performance page's."""

from __future__ import annotations

import re

from tests.docs.blocks import DOCS, ROOT, docs_hook

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_read_in_five_minutes() -> None:
    assert len(README.splitlines()) <= 250


def test_readme_starts_with_the_two_commands() -> None:
    first = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first and README.index(first[0]) < 200, "the first lines are the two commands"
    commands = [line.split("#")[0].strip() for line in first[1].splitlines()]
    assert commands == ["make demo", "make test"]


def test_readme_links_resolve() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 20
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == []


def test_readme_performance_figures_are_the_performance_page_s() -> None:
    """The README's figures are in the page's tables, as built from benchmarks/results/."""
    table = README.split("## Performance", 1)[1].split("\n## ", 1)[0]
    page = (DOCS / "performance" / "index.md").read_text(encoding="utf-8")
    built = docs_hook("gen_performance").render(page)
    figures = re.findall(r"\b\d{1,3}(?:,\d{3})+\b|\b\d\.\d\d\b", table)
    assert len(figures) >= 15
    assert [f for f in figures if f not in built] == []
