"""A batch of an aggregate step as (key, window) items with one partial per aggregation
(the formats are in :mod:`._aggregate_ops`)."""

from __future__ import annotations

from typing import Any

from eventbus import cel
from eventbus.eventing._codecs import event_to_json
from eventbus.eventing._event import CloudEvent
from eventbus.pipelines.steps._aggregate_ops import Item, dumps, fmt_number
from eventbus.pipelines.steps._aggregate_program import AggregateProgram
from eventbus.pipelines.steps._values import json_value

__all__ = ["build_items"]

#: One event of the batch: (index, key, time ms, value per aggregation).
Row = tuple[int, str, int, list[Any]]


def _windows(program: AggregateProgram, rows: list[Row]) -> dict[tuple[str, int], Item]:
    items: dict[tuple[str, int], Item] = {}
    gap = program.state_spec.gap_ms
    if gap:
        by_key: dict[str, list[Row]] = {}
        for r in rows:
            by_key.setdefault(r[1], []).append(r)
        for key, krows in by_key.items():
            krows.sort(key=lambda r: (r[2], r[0]))
            current = None
            for i, _, t, _ in krows:
                if current is None or t >= current.max_t + gap:
                    current = items[(key, t)] = Item(key, t, t + gap, t, 0, [])
                current.events.append(i)
                current.max_t = t
                current.end = t + gap
        for it in items.values():
            it.events.sort()
        return items
    size, adv = program.size_ms, program.advance_ms
    if size == adv:  # tumbling: one window per event
        get = items.get
        for i, key, t, _ in rows:
            start = t - t % size
            found = get((key, start))
            if found is None:
                items[(key, start)] = Item(key, start, start + size, t, 0, [], [i])
            else:
                found.events.append(i)
                if t > found.max_t:
                    found.max_t = t
        return items
    for i, key, t, _ in rows:
        start = t - t % adv
        while start > t - size:
            it = items.get((key, start)) or items.setdefault(
                (key, start), Item(key, start, start + size, t, 0, [])
            )
            it.events.append(i)
            it.max_t = max(it.max_t, t)
            start -= adv
    return items


def _fold(
    program: AggregateProgram,
    a: int,
    it: Item,
    acts: dict[int, dict[str, Any]],
    failed: dict[int, Exception],
) -> str:
    init, add, merge = program.reducers[a]
    if merge is None:
        raise AssertionError
    acc = init
    for i in it.events:
        if i in failed:
            continue
        act = dict(acts[i])
        act["acc"] = acc
        try:
            acc = json_value(add.evaluate(act))
        except (cel.CELError, ValueError, TypeError) as exc:
            msg = f"aggregation {program.names[a]!r}: add {program.spec.aggregations[program.names[a]].add!r} failed: {exc}"  # type: ignore[union-attr]
            failed[i] = type(exc)(msg)
    return f"1\n{dumps(acc)}"


def _partial(
    program: AggregateProgram, a: int, it: Item, by_index: dict[int, Row], events: list[CloudEvent]
) -> str:
    op = program.state_spec.ops[a]
    if op == "count":
        return str(len(it.events))
    if op == "reducer":  # without merge: the events, folded when the window closes
        kept = [_event_json(events[i]) for i in it.events[: program.state_spec.maxes[a]]]
        return "\n".join([str(len(it.events)), *kept])
    vals = [(by_index[i][2], i, by_index[i][3][a]) for i in it.events]
    vals = [v for v in vals if v[2] is not None]
    if op in ("sum", "avg"):
        total = sum(v[2] for v in vals)
        return fmt_number(total) if op == "sum" else f"{fmt_number(total)} {len(vals)}"
    if not vals:
        return "" if op != "collect" else "0"
    if op == "min":
        return fmt_number(min(v[2] for v in vals))
    if op == "max":
        return fmt_number(max(v[2] for v in vals))
    if op == "first":
        t, _, v = min(vals, key=lambda v: (v[0], v[1]))
        return f"{t} {dumps(v)}"
    if op == "last":
        t, _, v = max(vals, key=lambda v: (v[0], v[1]))
        return f"{t} {dumps(v)}"
    if op == "distinct":
        return "\n".join(sorted({dumps(v[2]) for v in vals}))
    kept = [dumps(v[2]) for v in vals[: program.state_spec.maxes[a]]]
    return "\n".join([str(len(vals)), *kept])


def _tumbling_sums(program: AggregateProgram, rows: list[Row]) -> list[Item]:
    # Tumbling windows with count and sum aggregations only (the usual case): the items and
    # their partials in one pass over the rows, as _windows and _partial give them (each sum
    # added in event order from 0, a null value left out)
    size = program.size_ms
    ops = program.state_spec.ops
    sums = list(enumerate(a for a, op in enumerate(ops) if op == "sum"))
    layout, j = [], 0  # per aggregation: None (count) or its sum's place in the accumulators
    for op in ops:
        layout.append(None if op == "count" else j)
        j += op != "count"
    items: dict[tuple[str, int], tuple[Item, list[Any]]] = {}
    get = items.get
    for i, key, t, vals in rows:
        start = t - t % size
        found = get((key, start))
        if found is None:
            it = Item(key, start, start + size, t, 0, [], [i])
            found = items[(key, start)] = (it, [0] * len(sums))
        else:
            it = found[0]
            it.events.append(i)
            if t > it.max_t:
                it.max_t = t
        acc = found[1]
        for j, a in sums:
            v = vals[a]
            if v is not None:
                acc[j] += v
    out = []
    for it, acc in items.values():
        it.count = n = len(it.events)
        it.partials = [str(n) if j is None else fmt_number(acc[j]) for j in layout]
        out.append(it)
    return out


def build_items(
    program: AggregateProgram,
    rows: list[Row],
    acts: dict[int, dict[str, Any]],
    events: list[CloudEvent],
) -> tuple[list[Item], dict[int, Exception]]:
    """The batch's items under ``program``, and the events a reducer failed on (left out
    of every window)."""
    failed: dict[int, Exception] = {}
    if program.sums_only:
        return _tumbling_sums(program, rows), failed
    merging = [a for a, (_, _, m) in program.reducers.items() if m is not None]
    while True:  # a reducer failing on an event takes it out of all its windows: fold again
        items = list(_windows(program, [r for r in rows if r[0] not in failed]).values())
        before = len(failed)
        folds = {a: [_fold(program, a, it, acts, failed) for it in items] for a in merging}
        if len(failed) == before:
            break
    by_index = {r[0]: r for r in rows}
    for n, it in enumerate(items):
        it.count = len(it.events)
        it.partials = [
            folds[a][n] if a in folds else _partial(program, a, it, by_index, events)
            for a in range(len(program.state_spec.ops))
        ]
    return items, failed


def _event_json(e: CloudEvent) -> str:
    """An event as a reducer without ``merge`` keeps it."""
    return event_to_json(e).decode()
