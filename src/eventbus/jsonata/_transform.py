"""The transform operator ``| pattern | update [, delete] |``: a function that copies its
argument and updates (and deletes keys of) the parts the pattern selects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventbus.jsonata._errors import fail
from eventbus.jsonata._signature import Signature
from eventbus.jsonata._values import UNDEFINED, Builtin, Frame

__all__ = ["clone", "transform_fn"]

Fn = Callable[[Any, Frame], Any]
_SIGNATURE = Signature("<(oa):o>")


def clone(v: Any) -> Any:
    """A deep copy of JSON (plain dicts and lists)."""
    if isinstance(v, dict):
        return {k: clone(x) for k, x in v.items()}
    if isinstance(v, list):
        return [clone(x) for x in v]
    return v


def transform_fn(pattern: Fn, update: Fn, delete: Fn | None, position: int) -> Fn:
    """The closure building the transform function."""

    def build(inp: Any, env: Frame) -> Any:
        def transformer(call_env: Frame, obj: Any) -> Any:
            if obj is UNDEFINED:
                return UNDEFINED
            result = clone(obj)
            matches = pattern(result, env)
            if matches is UNDEFINED:
                return result
            if not isinstance(matches, list):
                matches = [matches]
            for match in matches:
                upd = update(match, env)
                if upd is not UNDEFINED:
                    if not isinstance(upd, dict):
                        msg = "The insert/update clause of the transform expression must evaluate to an object"
                        raise fail("T2011", msg, position, upd)
                    if isinstance(match, dict):
                        match.update(upd)
                if delete is not None:
                    dels = delete(match, env)
                    if dels is UNDEFINED:
                        continue
                    names = dels if isinstance(dels, list) else [dels]
                    if not all(n.__class__ is str for n in names):
                        msg = "The delete clause of the transform expression must evaluate to a string or array of strings"
                        raise fail("T2012", msg, position, dels)
                    if isinstance(match, dict):
                        for n in names:
                            match.pop(n, None)
            return result

        return Builtin("transform", transformer, _SIGNATURE, 1)

    return build
