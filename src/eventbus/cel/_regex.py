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

from eventbus._internal.re2_adapter import compile_search
from eventbus.cel._errors import EvalError, brief

__all__ = ["MAX_CACHED_PATTERN_LENGTH", "Regex", "compile_regex"]

#: Dynamic patterns up to this many characters are cached (at most 256 of them).
MAX_CACHED_PATTERN_LENGTH: Final = 1024


class Regex:
    """A compiled RE2 pattern; :meth:`search` is CEL ``matches()`` (a partial match)."""

    __slots__ = ("pattern", "search")

    def __init__(self, pattern: str) -> None:
        search, reason = compile_search(pattern)
        if search is None:
            if len(reason) > 120:  # RE2 quotes the offending part of the pattern
                reason = reason[:120] + "..."
            msg = (
                f"invalid regular expression {brief(pattern)}: {reason}; CEL matches() takes "
                "RE2 syntax (no backreferences or lookaround), "
                "see https://github.com/google/re2/wiki/Syntax"
            )
            raise EvalError(msg)
        self.pattern = pattern
        #: ``search(text)``: True if the pattern matches anywhere in ``text``
        self.search = search

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
