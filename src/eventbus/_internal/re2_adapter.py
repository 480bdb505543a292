"""google-re2's extension type, the one non-public name EventBus uses of it (``google-re2``
pinned in ``pyproject.toml``; ``tests/unit/_internal/test_re2_adapter.py`` fails on an upgrade
that renames it).

The module-level API (``re2.compile(p).search(s)``) builds a match object through a Python
generator, ~10 µs a call; the extension type ``re2._re2.RE2`` answers "is there a match" in
~1.5 µs. CEL ``matches()`` (``cel/_regex.py``) and JSON Schema ``pattern`` on event data
(``eventing/sources/_data_schema.py``) ask only that, on the gateway's loop and on every
event, so they go through :func:`compile_search`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import re2

__all__ = ["PINNED_RE2", "compile_regex", "compile_search"]

#: the google-re2 version the extension type was checked against
PINNED_RE2: Final = "1.1.20251105"

_OPTIONS: Final = re2.Options()
_OPTIONS.log_errors = False  # errors become the caller's, named; RE2 must not write to stderr
_OPTIONS.never_capture = True  # only "is there a match" is asked
_QUIET: Final = re2.Options()
_QUIET.log_errors = False
_RE2: Final[Any] = re2._re2.RE2
_UNANCHORED: Final = _RE2.Anchor.UNANCHORED


def compile_search(pattern: str) -> tuple[Callable[[str], bool] | None, str]:
    """Compile an RE2 pattern into a partial-match test.

    Returns:
        ``(search, "")`` where ``search(text)`` is True if the pattern matches anywhere in
        ``text``; or ``(None, reason)`` with RE2's reason when it cannot compile the pattern.
    """
    compiled = _RE2(pattern.encode("utf-8", "surrogatepass"), _OPTIONS)
    if not compiled.ok():
        return None, bytes(compiled.error()).decode("utf-8", "replace")
    match = compiled.Match

    def search(text: str) -> bool:
        data = text.encode("utf-8", "surrogatepass")
        return bool(match(_UNANCHORED, data, 0, len(data))[0][0] >= 0)

    return search, ""


def compile_regex(pattern: str) -> tuple[Any, str]:
    """Compile an RE2 pattern with the public module API, for searches that need the match
    (positions, groups): ``(regexp, "")`` or ``(None, reason)``.

    The regexp's ``search(text, pos)``, ``finditer``, ``split`` and ``sub`` run in linear time.
    """
    try:
        return re2.compile(pattern, _QUIET), ""
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        return None, reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
