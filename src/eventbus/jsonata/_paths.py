"""Path evaluation: steps over sequences, tuple streams (``@``, ``#``, ``%``), predicates,
sorting and grouping (jsonata-js ``evaluatePath`` and friends), as closures."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from eventbus.jsonata._errors import fail
from eventbus.jsonata._values import UNDEFINED, Cons, Frame, Seq, append, to_boolean

__all__ = [
    "Fn",
    "filter_fn",
    "frame_from_tuple",
    "group_fn",
    "lookup",
    "path_fn",
    "pick",
    "sort_step",
]

Fn = Callable[[Any, Frame], Any]


def lookup(inp: Any, key: str) -> Any:
    """``input.key`` over objects and (flattening) arrays."""
    if isinstance(inp, dict):
        return inp.get(key, UNDEFINED)
    if isinstance(inp, list):
        out = Seq()
        for item in inp:
            r = lookup(item, key)
            if r is not UNDEFINED:
                if isinstance(r, list):
                    out.extend(r)
                else:
                    out.append(r)
        return out
    return UNDEFINED


def frame_from_tuple(env: Frame, tup: dict[str, Any]) -> Frame:
    """A child frame binding every variable a tuple carries."""
    f = Frame(env)
    f.vars.update(tup)
    return f


def _is_number_list(v: Any) -> bool:
    return (
        isinstance(v, list)
        and len(v) > 0
        and all((x.__class__ is int or x.__class__ is float) for x in v)
    )


def pick(inp: Any, index: int, results: Seq) -> Any:
    """A number predicate ``[n]``: the item at ``index`` (negative: from the end) into
    ``results``, or the item itself where it is an array."""
    if not isinstance(inp, list):
        inp = [inp]
    i = index + len(inp) if index < 0 else index
    if 0 <= i < len(inp):
        item = inp[i]
        if isinstance(item, list):
            return item
        results.append(item)
    return results


def filter_fn(pred: Any, pred_fn: Fn) -> Callable[[Any, Frame], Any]:
    """Apply one predicate ``[...]`` to a value or sequence."""
    if pred.type == "number":
        index = math.floor(pred.value)

        def by_index(inp: Any, env: Frame) -> Any:
            results = Seq()
            if isinstance(inp, Seq) and inp.tuple_stream:
                results.tuple_stream = True
            return pick(inp, index, results)

        return by_index

    def by_predicate(inp: Any, env: Frame) -> Any:
        results = Seq()
        tuples = isinstance(inp, Seq) and inp.tuple_stream
        if tuples:
            results.tuple_stream = True
        if not isinstance(inp, list):
            inp = [inp]
        n = len(inp)
        env.state.charge(n)
        for i, item in enumerate(inp):
            res = pred_fn(item["@"], frame_from_tuple(env, item)) if tuples else pred_fn(item, env)
            cls = res.__class__
            if cls is int or cls is float:
                res = [res]
            if _is_number_list(res):
                for r in res:
                    j = math.floor(r)
                    if j < 0:
                        j += n
                    if j == i:
                        results.append(item)
            elif to_boolean(res) is True:
                results.append(item)
        return results

    return by_predicate


def stages_fn(stages: list[tuple[str, Any]]) -> Callable[[Any, Frame], Any]:
    """Run a step's stages (predicates and ``#`` index bindings) in order."""

    def run(result: Any, env: Frame) -> Any:
        for kind, payload in stages:
            if kind == "filter":
                result = payload(result, env)
            else:
                for i, tup in enumerate(result):
                    tup[payload] = i
        return result

    return run


def sort_step(terms: list[tuple[bool, Fn]], position: int) -> Callable[[Any, Frame], Any]:
    """``^(<a, >b)``: a stable sort by the terms' values."""

    def run(inp: Any, env: Frame) -> Any:
        if not isinstance(inp, list):
            return inp
        tuples = isinstance(inp, Seq) and inp.tuple_stream
        keys = []
        env.state.charge(len(inp) * len(terms))
        for item in inp:
            if tuples:
                e = frame_from_tuple(env, item)
                keys.append([t(item["@"], e) for _, t in terms])
            else:
                keys.append([t(item, env) for _, t in terms])

        def compare(a: int, b: int) -> int:
            for n, (descending, _) in enumerate(terms):
                x, y = keys[a][n], keys[b][n]
                if x is UNDEFINED:
                    if y is UNDEFINED:
                        continue
                    return 1
                if y is UNDEFINED:
                    return -1
                xs, ys = x.__class__ in (int, float, str), y.__class__ in (int, float, str)
                if not xs or not ys:
                    msg = "The expressions within an order-by clause must evaluate to numeric or string values"
                    raise fail("T2008", msg, position, x if not xs else y)
                if (x.__class__ is str) != (y.__class__ is str):
                    msg = (
                        "Type mismatch within order-by clause. All values must be of the same type"
                    )
                    raise fail("T2007", msg, position, x)
                if x == y:
                    continue
                c = -1 if x < y else 1
                return -c if descending else c
            return 0

        order = sorted(range(len(inp)), key=functools.cmp_to_key(compare))
        out = Seq(inp[i] for i in order)
        out.tuple_stream = tuples
        return out

    return run


def _reduce_tuples(stream: Any) -> dict[str, Any]:
    if not isinstance(stream, list):
        return dict(stream)
    result = dict(stream[0])
    for tup in stream[1:]:
        for k, v in tup.items():
            result[k] = append(result.get(k, UNDEFINED), v)
    return result


def group_fn(pairs: list[tuple[Fn, Fn]], position: int) -> Callable[[Any, Frame], Any]:
    """An object constructor or a ``{...}`` grouping over a sequence."""

    def run(inp: Any, env: Frame) -> Any:
        reduce = isinstance(inp, Seq) and inp.tuple_stream
        items = inp if isinstance(inp, list) else [inp]
        if not items:
            items = [UNDEFINED]
        groups: dict[str, list[Any]] = {}
        for item in items:
            tup = reduce and item is not UNDEFINED
            e = frame_from_tuple(env, item) if tup else env
            context = item["@"] if tup else item
            for index, (key_fn, _) in enumerate(pairs):
                key = key_fn(context, e)
                if key is UNDEFINED:
                    continue
                if key.__class__ is not str:
                    msg = "Key in object structure must evaluate to a string"
                    raise fail("T1003", msg, position, key)
                entry = groups.get(key)
                if entry is None:
                    groups[key] = [item, index]
                else:
                    if entry[1] != index:
                        msg = f"Multiple key definitions evaluate to same key: {key!r}"
                        raise fail("D1009", msg, position, key)
                    entry[0] = append(entry[0], item)
        result: dict[str, Any] = {}
        for key, (data, index) in groups.items():
            e = env
            if reduce and data is not UNDEFINED:
                reduced = _reduce_tuples(data)
                data = reduced.pop("@")
                e = frame_from_tuple(env, reduced)
            value = pairs[index][1](data, e)
            if value is not UNDEFINED:
                result[key] = value
        return result

    return run


def _flatten_step(result: list[Any], last: bool) -> Any:
    if last and len(result) == 1 and isinstance(result[0], list) and not isinstance(result[0], Seq):
        return result[0]
    out = Seq()
    for r in result:
        if isinstance(r, list) and r.__class__ is not Cons:
            out.extend(r)
        else:
            out.append(r)
    return out


def path_fn(steps: list[dict[str, Any]], keep_singleton: bool, group: Any,
            tuple_path: bool) -> Fn:  # fmt: skip
    """A path ``a.b.c``: each step maps over the previous step's sequence and flattens."""
    first_is_var = steps[0]["type"] == "variable"
    n = len(steps)
    if not (keep_singleton or group is not None or tuple_path or steps[0]["consarray"]) and all(
        not s["tuple"] and s["sort"] is None and s["focus"] is None for s in steps
    ):
        return _mapping_path([(s["fn"], s["stages"]) for s in steps], first_is_var)

    def run(inp: Any, env: Frame) -> Any:
        seq = inp if isinstance(inp, list) and not first_is_var else Seq([inp])
        result: Any = UNDEFINED
        tuples: Any = None
        is_tuple = False
        for ii, step in enumerate(steps):
            if step["tuple"]:
                is_tuple = True
            if ii == 0 and step["consarray"]:
                result = step["fn"](seq, env)
            elif is_tuple:
                tuples = _tuple_step(step, seq, tuples, env)
            elif step["sort"] is not None:
                result = step["sort"](seq, env)
                if step["stages"] is not None:
                    result = step["stages"](result, env)
            else:
                fn = step["fn"]
                stages = step["stages"]
                env.state.charge(len(seq))
                raw = []
                for item in seq:
                    r = fn(item, env)
                    if stages is not None:
                        r = stages(r, env)
                    if r is not UNDEFINED:
                        raw.append(r)
                result = _flatten_step(raw, ii == n - 1)
            if not is_tuple and (result is UNDEFINED or (isinstance(result, list) and not result)):
                break
            if step["focus"] is None:
                seq = result if isinstance(result, list) else Seq([result])
        if is_tuple:
            result = tuples if tuple_path else Seq(t["@"] for t in tuples)
        if keep_singleton:
            if result.__class__ is Cons:
                result = Seq([result])
            if isinstance(result, Seq):
                result.keep_singleton = True
        if group is not None:
            result = group(tuples if is_tuple else result, env)
        return result

    return run


def _mapping_path(plan: list[tuple[Fn, Any]], first_is_var: bool) -> Fn:
    """A path of plain steps (no tuples, sorts, bindings): map, filter, flatten."""
    last = len(plan) - 1

    def run(inp: Any, env: Frame) -> Any:
        seq: Any = inp if isinstance(inp, list) and not first_is_var else (inp,)
        charge = env.state.charge
        result: Any = UNDEFINED
        for ii, (fn, stages) in enumerate(plan):
            charge(len(seq))
            raw = []
            for item in seq:
                r = fn(item, env)
                if stages is not None:
                    r = stages(r, env)
                if r is not UNDEFINED:
                    raw.append(r)
            if not raw:
                return Seq()
            if (
                ii == last
                and len(raw) == 1
                and isinstance(raw[0], list)
                and raw[0].__class__ is not Seq
            ):
                return raw[0]
            result = Seq()
            for r in raw:
                if isinstance(r, list) and r.__class__ is not Cons:
                    result.extend(r)
                else:
                    result.append(r)
            if not result:
                return result
            seq = result
        return result

    return run


def _tuple_step(step: dict[str, Any], seq: Any, tuples: Any, env: Frame) -> Any:
    if step["sort"] is not None:
        if tuples is not None:
            result = step["sort"](tuples, env)
        else:
            srt = step["sort"](Seq(seq), env)
            result = Seq()
            result.tuple_stream = True
            for i, v in enumerate(srt):
                tup = {"@": v}
                if step["index"] is not None:
                    tup[step["index"]] = i
                result.append(tup)
        if step["stages"] is not None:
            result = step["stages"](result, env)
        return result
    result = Seq()
    result.tuple_stream = True
    if tuples is None:
        tuples = [{"@": item} for item in seq]
    fn, focus, index, ancestor = step["fn"], step["focus"], step["index"], step["ancestor"]
    env.state.charge(len(tuples))
    for tup in tuples:
        res = fn(tup["@"], frame_from_tuple(env, tup))
        if res is UNDEFINED:
            continue
        if not isinstance(res, list):
            res = [res]
        res_tuples = isinstance(res, Seq) and res.tuple_stream
        for bb, r in enumerate(res):
            new = dict(tup)
            if res_tuples:
                new.update(r)
            else:
                if focus is not None:
                    new[focus] = r
                    new["@"] = tup["@"]
                else:
                    new["@"] = r
                if index is not None:
                    new[index] = bb
                if ancestor is not None:
                    new[ancestor] = tup["@"]
            result.append(new)
    if step["stages"] is not None:
        result = step["stages"](result, env)
    return result
