"""String functions of the JSONata standard library."""

from __future__ import annotations

import base64
import re
import urllib.parse
from typing import Any

from eventbus.jsonata._apply import call
from eventbus.jsonata._errors import fail
from eventbus.jsonata._regex import Regex, check_pattern
from eventbus.jsonata._values import UNDEFINED, Frame, Seq, is_function, stringify, to_boolean

__all__ = ["STRING_FUNCTIONS"]

U = UNDEFINED


def _string(env: Frame, arg: Any, prettify: Any = U) -> Any:
    if arg is U:
        return U
    if arg.__class__ is str:
        return arg
    if is_function(arg):
        return ""
    if arg.__class__ is float and (arg != arg or arg in (float("inf"), float("-inf"))):
        raise fail("D3001", "Attempting to invoke string function on Infinity or NaN", 0, arg)
    if isinstance(arg, Seq) and arg.outer_wrapper:
        arg = arg[0]
    s = stringify(arg, 2 if to_boolean(prettify) is True else None)
    env.state.check_length(len(s), "A string")
    return s


def _length(env: Frame, s: Any) -> Any:
    return U if s is U else len(s)


def _substring(env: Frame, s: Any, start: Any, length: Any = U) -> Any:
    if s is U:
        return U
    n = len(s)
    start = int(start)
    if n + start < 0:
        start = 0
    if length is not U:
        length = int(length) if length == length else 0
        if length <= 0:
            return ""
        end = start + length if start >= 0 else n + start + length
        return s[start:end] if start >= 0 else s[n + start : end]
    return s[start:] if start >= 0 else s[n + start :]


def _before(env: Frame, s: Any, chars: Any) -> Any:
    if s is U:
        return U
    i = s.find(chars)
    return s if i < 0 else s[:i]


def _after(env: Frame, s: Any, chars: Any) -> Any:
    if s is U:
        return U
    i = s.find(chars)
    return s if i < 0 else s[i + len(chars) :]


def _trim(env: Frame, s: Any) -> Any:
    if s is U:
        return U
    return re.sub(r"[ \t\n\r]+", " ", s).strip(" ")


def _pad(env: Frame, s: Any, width: Any, char: Any = U) -> Any:
    if s is U:
        return U
    if char is U or char == "":
        char = " "
    width = int(width)
    n = abs(width) - len(s)
    if n <= 0:
        return s
    env.state.check_length(abs(width), "A padded string")
    padding = (char * (n // len(char) + 1))[:n]
    return s + padding if width > 0 else padding + s


def _contains(env: Frame, s: Any, token: Any) -> Any:
    if s is U:
        return U
    if token is U:
        return U
    check_pattern(token, "$contains")
    if token.__class__ is str:
        return token in s
    return token.first(s) is not U


def _limit(limit: Any, code: str, name: str) -> int | None:
    if limit is U:
        return None
    if limit < 0:
        raise fail(
            code, f"Third argument of {name} function must evaluate to a positive number", 0, limit
        )
    return int(limit)


def _split(env: Frame, s: Any, sep: Any, limit: Any = U) -> Any:
    if s is U:
        return U
    lim = _limit(limit, "D3020", "split")
    check_pattern(sep, "$split")
    if sep.__class__ is str:
        parts = list(s) if sep == "" else s.split(sep)
    else:
        parts = []
        pos = 0
        for start, end, _, _ in sep.matches(s, zero_ok=True):
            parts.append(s[pos:start])
            pos = end
        parts.append(s[pos:])
    if lim is not None:
        parts = parts[:lim]
    return parts


def _join(env: Frame, strs: Any, sep: Any = U) -> Any:
    if strs is U:
        return U
    s = ("" if sep is U else sep).join(strs)
    env.state.check_length(len(s), "A string")
    return s


def _expand(replacement: str, match: str, groups: list[Any]) -> str:
    out: list[str] = []
    i = 0
    n = len(replacement)
    while i < n:
        ch = replacement[i]
        if ch == "$" and i + 1 < n:
            nxt = replacement[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt.isdigit():
                j = i + 1
                while j < n and replacement[j].isdigit():
                    j += 1
                digits = replacement[i + 1 : j]
                # the longest prefix naming an existing group (jsonata-js)
                while len(digits) > 1 and int(digits) > len(groups):
                    digits = digits[:-1]
                g = int(digits)
                if g == 0:
                    out.append(match)
                elif g <= len(groups):
                    out.append(groups[g - 1] or "")
                out.append(replacement[i + 1 + len(digits) : j])
                i = j
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _replace(env: Frame, s: Any, pattern: Any, replacement: Any, limit: Any = U) -> Any:
    if s is U:
        return U
    if pattern == "":
        raise fail(
            "D3010", "Second argument of replace function cannot be an empty string", 0, pattern
        )
    lim = _limit(limit, "D3011", "replace")
    check_pattern(pattern, "$replace")
    if pattern.__class__ is str:
        if replacement.__class__ is not str:
            replacement = _string(env, replacement)
        out = (
            s.replace(pattern, replacement) if lim is None else s.replace(pattern, replacement, lim)
        )
        env.state.check_length(len(out), "A string")
        return out
    parts: list[str] = []
    pos = 0
    for count, (start, end, text, groups) in enumerate(pattern.matches(s)):
        if lim is not None and count >= lim:
            break
        parts.append(s[pos:start])
        if replacement.__class__ is str:
            parts.append(_expand(replacement, text, groups))
        else:
            r = call(
                env, replacement, {"match": text, "start": start, "end": end, "groups": groups}
            )
            if r.__class__ is not str:
                msg = "Attempted to replace a matched string with a non-string value"
                raise fail("D3012", msg, 0, r)
            parts.append(r)
        pos = end
    parts.append(s[pos:])
    out = "".join(parts)
    env.state.check_length(len(out), "A string")
    return out


def _match(env: Frame, s: Any, regex: Regex, limit: Any = U) -> Any:
    if s is U:
        return U
    lim = _limit(limit, "D3040", "match")
    check_pattern(regex, "$match")
    out = Seq()
    for start, _, text, groups in regex.matches(s):
        if lim is not None and len(out) >= lim:
            break
        out.append({"match": text, "index": start, "groups": groups})
    return out


def _b64encode(env: Frame, s: Any) -> Any:
    return U if s is U else base64.b64encode(s.encode("latin-1", "replace")).decode("ascii")


def _b64decode(env: Frame, s: Any) -> Any:
    return U if s is U else base64.b64decode(s + "=" * (-len(s) % 4)).decode("utf-8", "replace")


_URI_SAFE = "-_.!~*'();/?:@&=+$,#"
_COMPONENT_SAFE = "-_.!~*'()"


def _encoder(safe: str) -> Any:
    def encode(env: Frame, s: Any) -> Any:
        if s is U:
            return U
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise fail("D3140", "Malformed URL passed to encode function", 0, s) from exc
        return urllib.parse.quote(s, safe=safe)

    return encode


def _decoder(reserved: str) -> Any:
    def decode(env: Frame, s: Any) -> Any:
        if s is U:
            return U
        if re.search(r"%(?![0-9A-Fa-f]{2})", s):
            raise fail("D3140", "Malformed URL passed to decode function", 0, s)
        try:
            return urllib.parse.unquote(s, errors="strict")
        except UnicodeDecodeError as exc:
            raise fail("D3140", "Malformed URL passed to decode function", 0, s) from exc

    return decode


STRING_FUNCTIONS: dict[str, tuple[Any, str]] = {
    "string": (_string, "<x-b?:s>"),
    "length": (_length, "<s-:n>"),
    "substring": (_substring, "<s-nn?:s>"),
    "substringBefore": (_before, "<s-s:s>"),
    "substringAfter": (_after, "<s-s:s>"),
    "uppercase": (lambda env, s: U if s is U else s.upper(), "<s-:s>"),
    "lowercase": (lambda env, s: U if s is U else s.lower(), "<s-:s>"),
    "trim": (_trim, "<s-:s>"),
    "pad": (_pad, "<s-ns?:s>"),
    "contains": (_contains, "<s-(sf):b>"),
    "split": (_split, "<s-(sf)n?:a<s>>"),
    "join": (_join, "<a<s>s?:s>"),
    "replace": (_replace, "<s-(sf)(sf)n?:s>"),
    "match": (_match, "<s-f<s:o>n?:a<o>>"),
    "base64encode": (_b64encode, "<s-:s>"),
    "base64decode": (_b64decode, "<s-:s>"),
    "encodeUrlComponent": (_encoder(_COMPONENT_SAFE), "<s-:s>"),
    "encodeUrl": (_encoder(_URI_SAFE), "<s-:s>"),
    "decodeUrlComponent": (_decoder(""), "<s-:s>"),
    "decodeUrl": (_decoder(""), "<s-:s>"),
}
