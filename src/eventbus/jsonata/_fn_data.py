"""Numeric, aggregate, array, object and higher-order functions of the JSONata library."""

from __future__ import annotations

import math
import random
import re
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from eventbus.jsonata._apply import call
from eventbus.jsonata._errors import fail
from eventbus.jsonata._values import (
    UNDEFINED,
    Frame,
    Seq,
    append,
    deep_equal,
    is_function,
    is_number,
    to_boolean,
)

__all__ = ["DATA_FUNCTIONS"]

U = UNDEFINED
_NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]+)?([Ee][-+]?[0-9]+)?$")


def _as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def _number(env: Frame, v: Any) -> Any:
    if v is U:
        return U
    cls = v.__class__
    if cls is bool:
        return 1 if v else 0
    if cls is int or cls is float:
        return v
    if cls is str:
        s = v.strip()
        if _NUMBER.match(s):
            f = float(s)
            if math.isfinite(f):
                return (
                    int(f)
                    if f.is_integer() and abs(f) < 2**53 and "." not in s and "e" not in s.lower()
                    else f
                )
        m = re.fullmatch(r"0([xXoObB])([0-9A-Fa-f]+)", s)
        if m:
            base = {"x": 16, "o": 8, "b": 2}[m.group(1).lower()]
            try:
                return int(m.group(2), base)
            except ValueError:
                pass
    raise fail("D3030", "Unable to cast value to a number", 0, v)


def _round(env: Frame, n: Any, precision: Any = U) -> Any:
    if n is U:
        return U
    p = 0 if precision is U else int(precision)
    d = Decimal(repr(n)).quantize(Decimal(1).scaleb(-p), rounding=ROUND_HALF_EVEN)
    r = float(d)
    return int(r) if r.is_integer() and abs(r) < 2**53 else r


def _power(env: Frame, b: Any, e: Any) -> Any:
    if b is U:
        return U
    try:
        r = math.pow(b, e)
    except (OverflowError, ValueError):
        r = math.nan
    if not math.isfinite(r):
        raise fail(
            "D3061",
            f"The power function has resulted in a value that cannot be represented as a JSON number: base={b}, exponent={e}",
            0,
            b,
        )
    return int(r) if b.__class__ is int and e.__class__ is int and e >= 0 and abs(r) < 2**53 else r


def _sqrt(env: Frame, n: Any) -> Any:
    if n is U:
        return U
    if n < 0:
        raise fail("D3060", f"The sqrt function cannot be applied to a negative number: {n}", 0, n)
    r = math.sqrt(n)
    return int(r) if r.is_integer() and n.__class__ is int else r


def _int_result(f: Any) -> Any:
    def run(env: Frame, n: Any) -> Any:
        return U if n is U else f(n)

    return run


def _sum(env: Frame, a: Any) -> Any:
    if a is U:
        return U
    total = 0
    for x in a:  # left to right, as JavaScript adds
        total += x
    return total


def _max(env: Frame, a: Any) -> Any:
    return U if a is U or not a else max(a)


def _min(env: Frame, a: Any) -> Any:
    return U if a is U or not a else min(a)


def _average(env: Frame, a: Any) -> Any:
    return U if a is U or not a else _sum(env, a) / len(a)


def _count(env: Frame, a: Any) -> Any:
    return 0 if a is U else len(_as_list(a))


def _exists(env: Frame, v: Any) -> Any:
    return v is not U


def _type(env: Frame, v: Any) -> Any:
    if v is U:
        return U
    if v is None:
        return "null"
    if v.__class__ is bool:
        return "boolean"
    if v.__class__ in (int, float):
        return "number"
    if v.__class__ is str:
        return "string"
    if isinstance(v, list):
        return "array"
    if is_function(v):
        return "function"
    return "object"


def _reverse(env: Frame, a: Any) -> Any:
    return U if a is U else Seq(reversed(_as_list(a))) if len(_as_list(a)) > 1 else a


def _merge_sort(env: Frame, items: list[Any], before: Any) -> list[Any]:
    if len(items) <= 1:
        return items
    mid = len(items) // 2
    left, right = _merge_sort(env, items[:mid], before), _merge_sort(env, items[mid:], before)
    out: list[Any] = []
    i = j = 0
    while i < len(left) and j < len(right):
        if before(left[i], right[j]):
            out.append(right[j])
            j += 1
        else:
            out.append(left[i])
            i += 1
    out.extend(left[i:])
    out.extend(right[j:])
    return out


def _sort(env: Frame, a: Any, fn: Any = U) -> Any:
    if a is U:
        return U
    items = list(_as_list(a))
    if len(items) <= 1:
        return items
    if fn is U:
        if all(is_number(x) for x in items) or all(x.__class__ is str for x in items):
            return Seq(sorted(items))
        raise fail(
            "D3070",
            "The single argument form of the sort function can only be applied to an array of strings or an array of numbers.  Use the second argument to specify a comparison function",
            0,
        )
    env.state.charge(len(items) * max(1, len(items).bit_length()))
    return Seq(_merge_sort(env, items, lambda x, y: to_boolean(call(env, fn, x, y)) is True))


def _shuffle(env: Frame, a: Any) -> Any:
    if a is U:
        return U
    items = list(_as_list(a))
    random.shuffle(items)
    return items


def _distinct(env: Frame, a: Any) -> Any:
    if a is U:
        return U
    if not isinstance(a, list) or len(a) <= 1:
        return a
    out = Seq()
    for x in a:
        if not any(deep_equal(x, y) for y in out):
            out.append(x)
    return out


def _zip(env: Frame, *arrays: Any) -> Any:
    lists = [[] if a is U else _as_list(a) for a in arrays]
    n = min((len(x) for x in lists), default=0)
    return [list(t) for t in zip(*(x[:n] for x in lists), strict=True)]


def _keys(env: Frame, v: Any) -> Any:
    out = Seq()
    if isinstance(v, list):
        seen: dict[str, None] = {}
        for x in v:
            if isinstance(x, dict):
                seen.update(dict.fromkeys(x))
        out.extend(seen)
    elif isinstance(v, dict) and not is_function(v):
        out.extend(v.keys())
    return out


def _lookup(env: Frame, v: Any, key: Any) -> Any:
    from eventbus.jsonata._paths import lookup

    return lookup(v, key)


def _spread(env: Frame, v: Any) -> Any:
    if isinstance(v, list):
        out = Seq()
        for x in v:
            r = _spread(env, x)
            out.extend(r if isinstance(r, list) else [r])
        return out
    if isinstance(v, dict):
        return Seq({k: x} for k, x in v.items())
    return v


def _merge(env: Frame, a: Any) -> Any:
    if a is U:
        return U
    out: dict[str, Any] = {}
    for x in _as_list(a):
        out.update(x)
    return out


def _each(env: Frame, obj: Any, fn: Any) -> Any:
    if obj is U:
        return U
    out = Seq()
    for k, v in obj.items():
        r = call(env, fn, v, k, obj)
        if r is not U:
            out.append(r)
    return out


def _sift(env: Frame, obj: Any, fn: Any) -> Any:
    if obj is U:
        return U
    out = {k: v for k, v in obj.items() if to_boolean(call(env, fn, v, k, obj)) is True}
    return out if out else U


def _map(env: Frame, a: Any, fn: Any) -> Any:
    if a is U:
        return U
    items = _as_list(a)
    out = Seq()
    for i, x in enumerate(items):
        r = call(env, fn, x, i, items)
        if r is not U:
            out.append(r)
    return out


def _filter(env: Frame, a: Any, fn: Any) -> Any:
    if a is U:
        return U
    items = _as_list(a)
    return Seq(x for i, x in enumerate(items) if to_boolean(call(env, fn, x, i, items)) is True)


def _single(env: Frame, a: Any, fn: Any = U) -> Any:
    if a is U:
        return U
    items = _as_list(a)
    found = U
    seen = False
    for i, x in enumerate(items):
        if fn is U or to_boolean(call(env, fn, x, i, items)) is True:
            if seen:
                raise fail(
                    "D3138",
                    "The $single() function expected exactly 1 matching result.  Instead it matched more.",
                    0,
                )
            found, seen = x, True
    if not seen:
        raise fail(
            "D3139",
            "The $single() function expected exactly 1 matching result.  Instead it matched 0.",
            0,
        )
    return found


def _reduce(env: Frame, a: Any, fn: Any, init: Any = U) -> Any:
    if a is U:
        return U
    arity = getattr(fn, "arity", 2)
    if arity < 2:
        raise fail(
            "D3050",
            "The second argument of reduce function must be a function with at least two arguments",
            0,
            fn,
        )
    items = _as_list(a)
    if init is U:
        if not items:
            return U
        acc, start = items[0], 1
    else:
        acc, start = init, 0
    for i in range(start, len(items)):
        acc = call(env, fn, acc, items[i], i, items)
    return acc


def _error(env: Frame, msg: Any = U) -> Any:
    raise fail("D3137", "$error() function evaluated" if msg is U else msg, 0)


def _assert(env: Frame, cond: Any, msg: Any = U) -> Any:
    if not cond:
        raise fail("D3141", "$assert() statement failed" if msg is U else msg, 0)
    return U


def _append(env: Frame, a: Any, b: Any) -> Any:
    r = append(a, b)
    if isinstance(r, list):
        env.state.charge(len(r))
        env.state.check_length(len(r), "An array")
    return r


DATA_FUNCTIONS: dict[str, tuple[Any, str]] = {
    "number": (_number, "<(nsb)-:n>"),
    "abs": (_int_result(abs), "<n-:n>"),
    "floor": (_int_result(math.floor), "<n-:n>"),
    "ceil": (_int_result(math.ceil), "<n-:n>"),
    "round": (_round, "<n-n?:n>"),
    "power": (_power, "<n-n:n>"),
    "sqrt": (_sqrt, "<n-:n>"),
    "sum": (_sum, "<a<n>:n>"),
    "max": (_max, "<a<n>:n>"),
    "min": (_min, "<a<n>:n>"),
    "average": (_average, "<a<n>:n>"),
    "count": (_count, "<a:n>"),
    "boolean": (lambda env, v: to_boolean(v), "<x-:b>"),
    "not": (lambda env, v: U if v is U else not to_boolean(v), "<x-:b>"),
    "exists": (_exists, "<x:b>"),
    "type": (_type, "<x:s>"),
    "append": (_append, "<xx:a>"),
    "reverse": (_reverse, "<a:a>"),
    "sort": (_sort, "<af?:a>"),
    "shuffle": (_shuffle, "<a:a>"),
    "distinct": (_distinct, "<x:x>"),
    "zip": (_zip, "<a+>"),
    "keys": (_keys, "<x-:a<s>>"),
    "lookup": (_lookup, "<x-s:x>"),
    "spread": (_spread, "<x-:a<o>>"),
    "merge": (_merge, "<a<o>:o>"),
    "each": (_each, "<o-f:a>"),
    "sift": (_sift, "<o-f?:o>"),
    "map": (_map, "<af>"),
    "filter": (_filter, "<af>"),
    "single": (_single, "<af?>"),
    "reduce": (_reduce, "<afj?:j>"),
    "error": (_error, "<s?:x>"),
    "assert": (_assert, "<bs?:x>"),
}
