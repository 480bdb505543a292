"""CEL runtime, containers: map lookup, indexing, field selection, ``in``, map and list
literals, comprehension ranges (exact CEL semantics; see ``_runtime`` for the kinds)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, NoReturn, cast

from eventbus.cel._errors import EvalError
from eventbus.cel._runtime import eq, key_matches, kind, map_lookup, no_overload, type_name
from eventbus.cel._values import NONE, Optional

__all__ = [
    "has_field",
    "in_",
    "index",
    "iter_pairs",
    "iter_range",
    "make_list",
    "make_map",
    "opt_index",
    "opt_select",
    "select",
]

_NUMERIC: Final = frozenset({"int", "uint", "double"})


def index(c: Any, key: Any) -> Any:
    """CEL ``_[_]`` on lists and maps."""
    tc = type(c)
    if tc is dict:
        found, value = map_lookup(c, key)
        if found:
            return value
        _no_such_key(key)
    if tc is list or tc is tuple:
        return c[_list_index(c, key)]
    k = kind(c)
    if k == "map":
        found, value = map_lookup(c, key)
        if found:
            return value
        _no_such_key(key)
    if k == "list":
        return c[_list_index(c, key)]
    no_overload("_[_]", c, key)


def _no_such_key(key: object) -> NoReturn:
    msg = f"no such key: {key!r}"
    raise EvalError(msg)


def _list_index(c: Any, key: Any) -> int:
    k = kind(key)
    if k in ("int", "uint"):
        i = int(key)
    elif k == "double" and key == key and key not in (float("inf"), float("-inf")):
        if not key.is_integer():
            msg = f"invalid list index {key!r}"
            raise EvalError(msg)
        i = int(key)
    else:
        no_overload("_[_]", c, key)
    if 0 <= i < len(c):
        return i
    msg = f"index out of range: {i}"
    raise EvalError(msg)


def select(obj: Any, field: str) -> Any:
    """CEL field selection ``obj.field`` (maps only: no protobuf messages here)."""
    if isinstance(obj, Mapping):
        try:
            return obj[field]
        except KeyError:
            msg = f"no such key: {field!r}"
            raise EvalError(msg) from None
    msg = f"type '{type_name(obj)}' does not support field selection"
    raise EvalError(msg)


def has_field(obj: Any, field: str) -> bool:
    """``has(obj.field)``."""
    if isinstance(obj, Mapping):
        return field in obj
    msg = f"invalid type '{type_name(obj)}' for has() field test"
    raise EvalError(msg)


def opt_select(obj: Any, field: str) -> Optional:
    """``obj.?field``: an optional of the field, none when absent."""
    if type(obj) is Optional:
        if not obj.has:
            return NONE
        obj = obj.value
    if isinstance(obj, Mapping):
        return Optional(obj[field]) if field in obj else NONE
    msg = f"type '{type_name(obj)}' does not support field selection"
    raise EvalError(msg)


def opt_index(c: Any, key: Any) -> Optional:
    """``c[?key]``: an optional of the element, none when absent."""
    if type(c) is Optional:
        if not c.has:
            return NONE
        c = c.value
    k = kind(c)
    if k == "map":
        found, value = map_lookup(c, key)
        return Optional(value) if found else NONE
    if k == "list":
        try:
            return Optional(c[_list_index(c, key)])
        except EvalError:
            if kind(key) in _NUMERIC:
                return NONE
            raise
    no_overload("_[?_]", c, key)


def in_(x: Any, c: Any) -> bool:
    """CEL ``_in_``: list membership (CEL equality) or map key presence."""
    tc = type(c)
    if tc is list or tc is tuple:
        tx = type(x)
        if tx is str:
            return x in c
        return any(eq(x, e) for e in c)
    k = kind(c)
    if k == "map":
        return map_lookup(c, x)[0]
    if k == "list":
        return any(eq(x, e) for e in c)
    no_overload("@in", x, c)


_KEY_KINDS: Final = frozenset({"int", "uint", "bool", "string"})


def make_map(pairs: Iterable[tuple[Any, Any]]) -> dict[Any, Any]:
    """Build a CEL map, checking key types and duplicate keys."""
    out: dict[Any, Any] = {}
    for key, value in pairs:
        k = kind(key)
        if k not in _KEY_KINDS:
            msg = f"unsupported map key type '{type_name(key)}'"
            raise EvalError(msg)
        if key in out:
            stored = next(s for s in out if s == key)
            if key_matches(stored, key):
                msg = f"duplicate map key {key!r}"
                raise EvalError(msg)
            msg = f"map keys {stored!r} and {key!r} cannot be held in one map"
            raise EvalError(msg)
        out[key] = value
    return out


def make_list(items: Iterable[Any], optional: frozenset[int]) -> list[Any]:
    """Build a list literal with ``?``-marked optional elements."""
    out: list[Any] = []
    for i, item in enumerate(items):
        if i in optional:
            if type(item) is not Optional:
                no_overload("optional list element", item)
            if item.has:
                out.append(item.value)
        else:
            out.append(item)
    return out


def iter_range(r: Any) -> Iterable[Any]:
    """The elements of a comprehension range: list elements or map keys."""
    tr = type(r)
    if tr is list or tr is tuple:
        return cast("Iterable[Any]", r)
    k = kind(r)
    if k == "map":
        return list(r)
    if k == "list":
        return cast("Iterable[Any]", r)
    msg = f"expression of type '{type_name(r)}' cannot be the range of a comprehension"
    raise EvalError(msg)


def iter_pairs(r: Any) -> Iterable[tuple[Any, Any]]:
    """(index, value) pairs of a list, or (key, value) pairs of a map."""
    k = kind(r)
    if k == "list":
        return list(enumerate(r))
    if k == "map":
        return list(r.items())
    msg = f"expression of type '{type_name(r)}' cannot be the range of a comprehension"
    raise EvalError(msg)
