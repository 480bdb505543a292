"""The matcher that checks a tutorial's shown output against what its commands print, and the
tutorials' marks (the pages run in tests/integration/test_tutorials.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.blocks import DOCS, ROOT, blocks
from tests.docs.tutorial import mismatch, steps

PRINTED = """\
published 6 event(s) to payments
payment.large /shop/us demo-5
{
  "amount": 25000,
  "fraud_score": 0.9903
}
payment.large /shop/eu demo-1
{
  "amount": 1500,
  "fraud_score": 0.3536
}
"""


def test_the_whole_output_in_order_with_ellipses() -> None:
    assert (
        mismatch("published 6 event(s) to ...\npayment.large /shop/us demo-5\n...", PRINTED) is None
    )
    assert (
        mismatch('...\npayment.large ... demo-5\n...\n  "fraud_score": 0.3536\n}', PRINTED) is None
    )
    assert mismatch("...\n}", PRINTED) is None
    assert mismatch(PRINTED, PRINTED) is None
    # an extra line before or after (a new warning, say) is caught
    assert mismatch(PRINTED, PRINTED + "warning: deprecated\n") is not None
    assert mismatch(PRINTED, "warning: deprecated\n" + PRINTED) is not None


def test_a_wrong_value_a_wrong_order_or_a_gap_is_caught() -> None:
    assert mismatch('...\n"amount": 25001,\n...', PRINTED) is not None
    assert mismatch(
        "...\npayment.large /shop/eu demo-1\n...\npayment.large /shop/us demo-5\n...", PRINTED
    )
    # consecutive lines must be consecutive: without `...`, no line may be skipped
    assert mismatch('...\npayment.large /shop/us demo-5\n"amount": 25000,\n...', PRINTED)
    assert mismatch('...\npayment.large /shop/us demo-5\n{\n"amount": 25000,\n...', PRINTED) is None
    assert mismatch("anything", "") == "anything"


def test_unordered_records_may_come_in_any_order_but_each_whole() -> None:
    shown = (
        'payment.large /shop/eu demo-1\n{\n  "amount": 1500,\n...\npayment.large /shop/us demo-5'
    )
    assert mismatch(shown, PRINTED) is not None
    assert mismatch(shown, PRINTED, unordered=True) is None
    wrong = 'payment.large /shop/eu demo-1\n{\n  "amount": 25000,'
    assert mismatch(wrong, PRINTED, unordered=True) == wrong


def test_blanks_and_table_rules_of_any_width_are_one() -> None:
    table = "┏━━━━┳━━━━━━┓\n┃ in ┃  out ┃\n┡━━━━╇━━━━━━┩\n│  8 │    5 │\n└────┴──────┘\n"
    shown = "┏━┳━┓\n┃ in ┃ out ┃\n┡━━╇━━━━━━━━━━┩\n│ 8 │ 5 │\n└──┴──┘"
    assert mismatch(shown, table) is None
    assert mismatch(shown.replace("│ 8 │", "│ 9 │"), table) is not None


def test_many_ellipses_over_a_long_output_stay_linear() -> None:
    printed = "x\n" * 5_000
    assert mismatch("...\ny\n" * 50, printed) is not None
    assert mismatch("...\nx\n" * 50 + "...", printed) is None
    assert mismatch("...\nx\n" * 50 + "...", printed, unordered=True) is None


TUTORIALS = sorted((DOCS / "tutorials").glob("*.md"))


@pytest.mark.parametrize("page", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_output_and_file_marks_are_well_placed(page: Path) -> None:
    for step in steps(page):
        if step.kind == "file":
            assert step.name and "/" not in step.name, f"{step.block.where}: file NAME"
        if step.kind == "await":
            assert any(s.kind == "background" for s in steps(page)), step.block.where


def test_the_first_tutorial_shows_every_step_s_output() -> None:
    first = [s for s in steps(DOCS / "tutorials" / "first-pipeline.md") if s.kind == "shell"]
    assert len(first) >= 5 and all(s.expected for s in first)


def test_only_the_install_step_is_not_run() -> None:
    """The tutorials' skipped shell blocks: the install, whose target must exist."""
    skipped = [b for b in blocks() if b.path.parent == DOCS / "tutorials" and b.mark == "skip"]
    assert [b.where for b in skipped] == [b.where for b in skipped if "make setup" in b.text]
    assert len(skipped) == 1
    assert re.search(r"^setup:", (ROOT / "Makefile").read_text(), re.M)
