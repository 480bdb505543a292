"""Function signatures (``<s-nn?:s>``): parsed once, then each call's arguments are checked
and completed (the ``-`` context argument, single values promoted to arrays), as jsonata-js
``signature.js`` does."""

from __future__ import annotations

import re
from typing import Any

from eventbus.jsonata._errors import fail

__all__ = ["Signature", "symbol_of"]

_ARRAY_NAMES = {"a": "arrays", "b": "booleans", "f": "functions", "n": "numbers", "o": "objects",
                "s": "strings"}  # fmt: skip


def symbol_of(value: Any) -> str:
    """The signature letter of a value (``m`` for undefined)."""
    from eventbus.jsonata._values import UNDEFINED, is_function

    if value is UNDEFINED:
        return "m"
    if value is None:
        return "l"
    cls = value.__class__
    if cls is str:
        return "s"
    if cls is bool:
        return "b"
    if cls is int or cls is float:
        return "n"
    if isinstance(value, list):
        return "a"
    if isinstance(value, dict):
        return "o"
    if is_function(value):
        return "f"
    return "o"


def _closing(sig: str, start: int, open_: str, close: str) -> int:
    depth = 1
    pos = start
    while pos < len(sig) - 1:
        pos += 1
        if sig[pos] == open_:
            depth += 1
        elif sig[pos] == close:
            depth -= 1
            if depth == 0:
                break
    return pos


class _Param:
    __slots__ = ("context", "context_re", "regex", "subtype", "type")

    def __init__(self) -> None:
        self.regex = ""
        self.type = ""
        self.context = False
        self.context_re: re.Pattern[str] | None = None
        self.subtype: str | None = None


class Signature:
    """A parsed signature; :meth:`validate` checks one call's arguments."""

    def __init__(self, sig: str, position: int = 0) -> None:
        self.text = sig
        params: list[_Param] = []
        param = _Param()
        prev = param
        pos = 1
        while pos < len(sig):
            ch = sig[pos]
            if ch == ":":
                break
            if ch in "snblo":
                param.regex, param.type = f"[{ch}m]", ch
            elif ch == "a":
                param.regex, param.type = "[asnblfom]", ch
            elif ch == "f":
                param.regex, param.type = "f", ch
            elif ch == "j":
                param.regex, param.type = "[asnblom]", ch
            elif ch == "x":
                param.regex, param.type = "[asnblfom]", ch
            elif ch == "-":
                prev.context = True
                prev.context_re = re.compile(prev.regex)
                prev.regex += "?"
                pos += 1
                continue
            elif ch in "?+":
                prev.regex += ch
                pos += 1
                continue
            elif ch == "(":
                end = _closing(sig, pos, "(", ")")
                choice = sig[pos + 1 : end]
                if "<" in choice:
                    msg = "Choice groups containing parameterized types are not supported"
                    raise fail("S0402", msg, position, sig)
                param.regex, param.type = f"[{choice}m]", f"({choice})"
                pos = end
            elif ch == "<":
                if prev.type not in ("a", "f"):
                    msg = "Type parameters can only be applied to functions and arrays"
                    raise fail("S0401", msg, position, prev.type)
                end = _closing(sig, pos, "<", ">")
                prev.subtype = sig[pos + 1 : end]
                pos = end + 1
                continue
            else:
                pos += 1
                continue
            params.append(param)
            prev = param
            param = _Param()
            pos += 1
        self.params = params
        self._matches: dict[str, Any] = {}  # supplied symbols -> match (few distinct ones)
        self.regex = re.compile("^" + "".join(f"({p.regex})" for p in params) + "$")

    def validate(self, args: list[Any], context: Any, position: int = 0) -> list[Any]:
        """The arguments to pass: checked, with the context filled in where allowed."""
        from eventbus.jsonata._values import UNDEFINED

        supplied = "".join([symbol_of(a) for a in args])
        cached = self._matches.get(supplied)
        if cached is not None:
            m, identity = cached
            if identity:  # every argument given, one per parameter, nothing to convert
                return args
        else:
            m = self.regex.match(supplied)
            if m is not None and len(self._matches) < 256:
                identity = len(args) == len(self.params) and all(
                    len(g) == 1 and g != "m" and p.subtype is None
                    for g, p in zip(m.groups(), self.params, strict=True)
                )
                self._matches[supplied] = (m, identity)
        if m is None:
            self._invalid(args, supplied, position)
        out: list[Any] = []
        i = 0
        for n, param in enumerate(self.params):
            match = m.group(n + 1)
            if match == "":
                if param.context and param.context_re is not None:
                    if param.context_re.match(symbol_of(context)):
                        out.append(context)
                    else:
                        msg = f"Argument {i + 1} of function does not match function signature"
                        raise fail("T0411", msg, position, context)
                else:
                    out.append(args[i] if i < len(args) else UNDEFINED)
                    i += 1
                continue
            for single in match:
                arg = args[i] if i < len(args) else UNDEFINED
                if param.type == "a" and single != "m" and param.subtype is not None:
                    ok = True
                    if single != "a" and match != param.subtype:
                        ok = False
                    elif single == "a" and arg:
                        first = symbol_of(arg[0])
                        ok = first == param.subtype[0] and all(symbol_of(v) == first for v in arg)
                    if not ok:
                        kind = _ARRAY_NAMES.get(param.subtype, param.subtype)
                        msg = f"Argument {i + 1} of function must be an array of {kind}"
                        raise fail("T0412", msg, position, arg)
                    if single != "a":
                        arg = [arg]
                out.append(arg)
                i += 1
        return out

    def _invalid(self, args: list[Any], supplied: str, position: int) -> None:
        partial = "^"
        good = 0
        for p in self.params:
            partial += p.regex
            m = re.match(partial, supplied)
            if m is None:
                break
            good = len(m.group(0))
        value = args[good] if good < len(args) else None
        msg = f"Argument {good + 1} of function does not match function signature"
        raise fail("T0410", msg, position, value)
