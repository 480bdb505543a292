"""Regex literals ``/.../im`` on RE2 (linear time, through the project's RE2 adapter): the
match objects jsonata-js builds, for ``$match``, ``$contains``, ``$replace`` and ``$split``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from eventbus._internal.re2_adapter import compile_regex
from eventbus.jsonata._errors import fail
from eventbus.jsonata._values import UNDEFINED, Builtin

__all__ = ["Regex", "check_pattern"]


def check_pattern(pattern: object, function: str) -> None:
    """Refuse a function other than a regex literal as a pattern (jsonata-js's custom
    matchers), clearly."""
    if pattern.__class__ is not str and pattern.__class__ is not Regex:
        msg = f"{function}: the pattern must be a string or a regex literal /.../; custom matcher functions are not supported"
        raise fail("T1010", msg, 0, None)


class Regex:
    """A compiled regex literal; a function of one string returning a match object."""

    __slots__ = ("arity", "compiled", "pattern", "position")

    def __init__(self, pattern: str, flags: str, position: int = 0) -> None:
        inline = "".join(f for f in "im" if f in flags)
        source = f"(?{inline}){pattern}" if inline else pattern
        compiled, reason = compile_regex(source)
        if compiled is None:
            raise fail(
                "S0303", f"Invalid regular expression /{pattern}/: {reason}", position, pattern
            )
        self.compiled = compiled
        self.pattern = pattern
        self.position = position
        self.arity = 1

    def matches(
        self, text: str, zero_ok: bool = False
    ) -> Iterator[tuple[int, int, str, list[Any]]]:
        """Successive non-overlapping matches as ``(start, end, text, groups)``."""
        pos = 0
        n = len(text)
        search = self.compiled.search
        while pos <= n:
            m = search(text, pos)
            if m is None:
                return
            start, end = m.span()
            if start == end and not zero_ok:
                raise fail(
                    "D1004",
                    "Regular expression matches zero length string",
                    self.position,
                    self.pattern,
                )
            groups = ["" if g is None else g for g in m.groups()]
            yield start, end, m.group(0), groups
            pos = end if end > start else end + 1

    def first(self, text: str, start: int = 0) -> Any:
        """The match object at or after ``start`` (``{match, start, end, groups, next}``)."""
        m = self.compiled.search(text, start)
        if m is None:
            return UNDEFINED
        s, e = m.span()
        result: dict[str, Any] = {
            "match": m.group(0),
            "start": s,
            "end": e,
            "groups": ["" if g is None else g for g in m.groups()],
        }
        nxt = e if e > s else e + 1

        def next_(env: Any) -> Any:
            if nxt >= len(text):
                return UNDEFINED
            r = self.first(text, nxt)
            if r is not UNDEFINED and r["match"] == "":
                raise fail(
                    "D1004",
                    "Regular expression matches zero length string",
                    self.position,
                    self.pattern,
                )
            return r

        result["next"] = Builtin("next", next_, None, 0)
        return result

    def invoke(self, env: Any, *args: Any) -> Any:
        """Calling the regex as a function: its first match in the string."""
        text = args[0] if args else UNDEFINED
        if text is UNDEFINED:
            return UNDEFINED
        if text.__class__ is not str:
            raise fail(
                "T0410",
                "Argument 1 of function does not match function signature",
                self.position,
                text,
            )
        return self.first(text)
