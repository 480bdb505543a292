"""The events an ``aggregate`` step emits: a window's values as a CloudEvent with a
deterministic id (pipeline, program, key, window), reducers without ``merge`` folded here."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any

from eventbus import cel
from eventbus.eventing._codecs import event_from_json
from eventbus.eventing._event import CloudEvent
from eventbus.pipelines.steps._aggregate_ops import Window, number
from eventbus.pipelines.steps._aggregate_program import AggregateProgram
from eventbus.pipelines.steps._join_output import format_time_ms
from eventbus.pipelines.steps._values import json_value

__all__ = ["window_event"]

#: A window's bounds as text: the windows a timer closes at once share them (every key's).
_time_text = lru_cache(maxsize=256)(format_time_ms)


def window_event(
    program: AggregateProgram, counters: dict[str, int], w: Window, *, update: bool = False
) -> CloudEvent:
    """The event of a window's values (``update``: an intermediate one); ``counters`` (the
    step's) counts what collect and reducers dropped and the reducers that failed."""
    data: dict[str, Any] = {
        "key": w.key,
        "window_start": _time_text(w.start),
        "window_end": _time_text(w.end),
    }
    for a, (name, raw) in enumerate(zip(program.names, w.values)):
        data[name] = _final(program, counters, a, raw)
    basis = f"{program.pipeline}\x00{program.step_id}\x00{w.key}\x00{w.start}\x00{w.end}"
    if update:
        basis += f"\x00update\x00{w.count}"
    digest = hashlib.blake2b(basis.encode(), digest_size=10).hexdigest()
    attrs: dict[str, Any] = {
        "specversion": "1.0",
        "id": f"{program.step_id}-{digest}",
        "source": program.source,
        "type": program.type,
        "time": _time_text(w.end),
        "datacontenttype": "application/json",
        "partitionkey": w.key,
    }
    return CloudEvent(attrs, data)


def _final(program: AggregateProgram, counters: dict[str, int], a: int, raw: str) -> Any:
    op = program.state_spec.ops[a]
    if op in ("count", "distinct"):
        return int(raw or 0)
    if op == "sum":
        return number(raw or "0")
    if op == "avg":
        s, n = raw.split(" ")
        return number(s) / int(n) if int(n) else None
    if op in ("min", "max"):
        return number(raw) if raw else None
    if op in ("first", "last"):
        return json.loads(raw) if raw else None
    dropped, _, rest = raw.partition("\n")
    items = [x for x in rest.split("\n") if x]
    if op == "collect":
        counters["collect_truncated"] += int(dropped)
        return [json.loads(x) for x in items]
    counters["reducer_truncated"] += int(dropped)
    return _fold(program, counters, a, items)


def _fold(program: AggregateProgram, counters: dict[str, int], a: int, items: list[str]) -> Any:
    init, add, merge = program.reducers[a]
    acc = init
    try:
        if merge is not None:
            for x in items:
                acc = json_value(merge.evaluate({"acc": acc, "other": json.loads(x)}))
            return acc
        for x in items:
            act = program.build(event_from_json(x.encode()))
            act["acc"] = acc
            acc = json_value(add.evaluate(act))
    except (cel.CELError, ValueError, TypeError):
        counters["reducer_errors"] += 1
        return None
    return acc
