"""google-re2's extension type that ``_internal/re2_adapter.py`` uses still exists and answers
as the adapter reads it: this fails loudly on an upgrade that renames or changes it."""

from __future__ import annotations

from importlib.metadata import version

import re2

from eventbus._internal.re2_adapter import PINNED_RE2, compile_search


def test_the_pinned_version_is_installed() -> None:
    assert version("google-re2") == PINNED_RE2, (
        "google-re2 was upgraded: check _internal/re2_adapter.py's use of re2._re2.RE2 "
        "against the new version, then update PINNED_RE2 and pyproject's pin"
    )
    assert hasattr(re2._re2.RE2, "Anchor")


def test_search_is_a_partial_match_and_agrees_with_the_public_api() -> None:
    cases = [("b+", "abbbc"), ("^b", "abc"), ("é+$", "café"), ("(a+)+$", "a" * 40 + "!"), ("", "")]
    for pattern, text in cases:
        search, reason = compile_search(pattern)
        assert search is not None and reason == ""
        assert search(text) == (re2.compile(pattern).search(text) is not None), (pattern, text)


def test_a_pattern_re2_refuses_gives_its_reason() -> None:
    search, reason = compile_search("(a)\\1")
    assert search is None
    assert "backreference" in reason or "escape" in reason
