"""RE2 regular expressions for CEL ``matches()``: RE2 syntax, linear-time matching.

CEL specifies RE2 syntax and semantics. Python's ``re`` backtracks, so a pattern such as
``^(a+)+$`` takes time exponential in the input; RE2 (``google-re2``) matches in time
linear in the input and rejects what it cannot do in linear time (backreferences,
lookaround). Patterns compile once: literal patterns when the expression compiles,
dynamic ones through a bounded cache.
"""

from __future__ import annotations

import functools
from typing import Any, Final

import re2

from eventbus.cel._errors import EvalError, brief

__all__ = ["MAX_CACHED_PATTERN_LENGTH", "Regex", "compile_regex"]

#: Dynamic patterns up to this many characters are cached (at most 256 of them).
MAX_CACHED_PATTERN_LENGTH: Final = 1024

_OPTIONS: Final = re2.Options()
_OPTIONS.log_errors = False  # errors become CEL errors; RE2 must not write to stderr
_OPTIONS.never_capture = True  # matches() only asks whether there is a match
# The module-level API (re2.compile(...).search) builds match objects through a Python
# generator, ~10 µs a call; the extension type answers the same question in ~1.5 µs.
_RE2: Final[Any] = re2._re2.RE2
_UNANCHORED: Final = _RE2.Anchor.UNANCHORED


class Regex:
    """A compiled RE2 pattern; :meth:`search` is CEL ``matches()`` (a partial match)."""

    __slots__ = ("_match", "pattern")

    def __init__(self, pattern: str) -> None:
        compiled = _RE2(pattern.encode("utf-8", "surrogatepass"), _OPTIONS)
        if not compiled.ok():
            reason = bytes(compiled.error()).decode("utf-8", "replace")
            if len(reason) > 120:  # RE2 quotes the offending part of the pattern
                reason = reason[:120] + "..."
            msg = (
                f"invalid regular expression {brief(pattern)}: {reason}; CEL matches() takes "
                "RE2 syntax (no backreferences or lookaround), "
                "see https://github.com/google/re2/wiki/Syntax"
            )
            raise EvalError(msg)
        self.pattern = pattern
        self._match = compiled.Match

    def search(self, text: str) -> bool:
        """True if the pattern matches anywhere in ``text``."""
        data = text.encode("utf-8", "surrogatepass")
        return bool(self._match(_UNANCHORED, data, 0, len(data))[0][0] >= 0)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Regex, (self.pattern,))

    def __repr__(self) -> str:
        return f"Regex({self.pattern!r})"


@functools.lru_cache(maxsize=256)
def _cached(pattern: str) -> Regex:
    return Regex(pattern)


def compile_regex(pattern: str) -> Regex:
    """Compile an RE2 pattern; short patterns are cached.

    Raises:
        EvalError: The pattern is not valid RE2 syntax (or too large for RE2).
    """
    if len(pattern) <= MAX_CACHED_PATTERN_LENGTH:
        return _cached(pattern)
    return Regex(pattern)
