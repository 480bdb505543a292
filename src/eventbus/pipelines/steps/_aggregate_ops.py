"""The aggregate step's partial formats and its in-memory state.

Per batch the step folds each (key, window)'s events into one *partial* per aggregation, a
string the state merges into the window (the Redis scripts in :mod:`._aggregate_lua` and
:class:`MemoryAggregateState` here, with the same semantics):

==========  ==========================================  ===================================
op          partial                                     value returned for the window
==========  ==========================================  ===================================
count       ``<n>``                                     ``<n>``
sum         ``<number>``                                ``<number>``
avg         ``<sum> <n>``                               ``<sum> <n>``
min, max    ``<number>`` or ``''`` (no values)          the same
first, last ``<time ms> <JSON>`` or ``''``              ``<JSON>`` or ``''``
distinct    JSON texts, one a line                      ``<estimate>``
collect,    ``<total>`` then JSON texts, one a line     ``<dropped>`` then the kept texts
reducer
==========  ==========================================  ===================================

Ties: ``first`` keeps the earlier-arrived of equal times, ``last`` the later-arrived.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Item", "MemoryAggregateState", "Seen", "Spec", "Window", "fmt_number", "number"]


@dataclass(frozen=True)
class Spec:
    """What the state needs of the step's config."""

    ops: list[
        str
    ]  #: per aggregation: count, sum, avg, min, max, first, last, distinct, collect, reducer
    maxes: list[int]  #: per aggregation: most items kept (collect, reducer), else 0
    lateness_ms: int
    gap_ms: int = 0  #: session windows' gap (0: tumbling or hopping)
    update: bool = False  #: emit: update (values of the windows each batch changed)
    processing: bool = False  #: processing time (the watermark is the wall clock)
    idle_ms: int = 0  #: event time: the clock moves the watermark after this long without events


@dataclass
class Seen:
    """``delivery.dedupe``: the batch's event digests (by batch index) and how long the state
    remembers an applied one."""

    digests: dict[int, str]
    ttl_ms: int


@dataclass
class Item:
    """One (key, window)'s partials of a batch.

    ``end`` is exclusive (sessions: the last event's time + gap); ``events`` are the indices
    of the batch's events in it (not sent to the state)."""

    key: str
    start: int
    end: int
    max_t: int
    count: int
    partials: list[str]
    events: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Window:
    """A window's values as the state returns them (see the module docstring)."""

    wid: str  #: ``<start>:<key>``
    count: int
    end: int
    values: list[str]

    @property
    def start(self) -> int:
        return int(self.wid.partition(":")[0])

    @property
    def key(self) -> str:
        return self.wid.partition(":")[2]


def number(text: str) -> int | float:
    """A number the state stored (integers stay integers)."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def fmt_number(x: float) -> str:
    """A number as the state stores it."""
    return str(x) if isinstance(x, int) else repr(float(x))


def _wid(start: int, key: str) -> str:
    return f"{start}:{key}"


class MemoryAggregateState:
    """The Redis scripts' semantics in process memory (tests, ``eventbus test``)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.windows: dict[str, dict[str, Any]] = {}
        self.due: dict[str, int] = {}
        self.claimed: dict[str, int] = {}
        self.sessions: dict[str, list[int]] = {}
        self.wm: int | None = None  # the latest event time merged
        self.wmw = 0  # the wall clock when it last moved
        self.wmc: int | None = None  # the watermark the timer reached (events', or the clock's)
        self.seen: dict[str, int] = {}  # applied event digest -> forgotten at (ms)

    def _new(self) -> dict[str, Any]:
        init: dict[str, Any] = {"count": 0, "sum": 0, "avg": [0, 0], "distinct": set()}
        return {
            "c": 0,
            "e": 0,
            "a": [
                [[], 0] if op in ("collect", "reducer") else _copy(init.get(op))
                for op in self.spec.ops
            ],
        }

    def _add(self, w: dict[str, Any], a: int, p: str) -> None:
        op, acc = self.spec.ops[a], w["a"]
        if op == "count":
            acc[a] += int(p)
        elif op == "sum":
            acc[a] += number(p)
        elif op == "avg":
            s, n = p.split(" ")
            acc[a] = [acc[a][0] + number(s), acc[a][1] + int(n)]
        elif op in ("min", "max"):
            cur = acc[a]
            if p and (
                cur is None
                or (op == "min" and float(p) < float(cur))
                or (op == "max" and float(p) > float(cur))
            ):
                acc[a] = p
        elif op in ("first", "last"):
            if p:
                t, _, v = p.partition(" ")
                cur = acc[a]
                if (
                    cur is None
                    or (op == "first" and int(t) < cur[0])
                    or (op == "last" and int(t) >= cur[0])
                ):
                    acc[a] = (int(t), v)
        elif op == "distinct":
            if p:
                acc[a].update(p.split("\n"))
        else:
            total, _, rest = p.partition("\n")
            items, dropped = acc[a]
            taken = [x for x in rest.split("\n") if x][: max(0, self.spec.maxes[a] - len(items))]
            items += taken
            acc[a] = [items, dropped + int(total) - len(taken)]

    def _partial(self, w: dict[str, Any], a: int) -> str:
        op, v = self.spec.ops[a], w["a"][a]
        if op in ("count", "sum"):
            return fmt_number(v)
        if op == "avg":
            return f"{fmt_number(v[0])} {v[1]}"
        if op in ("min", "max"):
            return "" if v is None else str(v)
        if op in ("first", "last"):
            return "" if v is None else f"{v[0]} {v[1]}"
        if op == "distinct":
            return "\n".join(sorted(v))
        return "\n".join([str(len(v[0]) + v[1]), *v[0]])

    def values(self, wid: str) -> Window:
        """The window's values (as the Redis script returns them)."""
        w = self.windows[wid]
        out: list[str] = []
        for a, op in enumerate(self.spec.ops):
            v = w["a"][a]
            if op == "distinct":
                out.append(str(len(v)))
            elif op in ("collect", "reducer"):
                out.append("\n".join([str(v[1]), *v[0]]))
            elif op in ("first", "last"):
                out.append("" if v is None else v[1])
            else:
                out.append(self._partial(w, a))
        return Window(wid, w["c"], w["e"], out)

    def _merge(self, src: str, dst: str) -> None:
        s, d = self.windows.pop(src), self.windows.setdefault(dst, self._new())
        for a in range(len(self.spec.ops)):
            self._add(d, a, self._partial(s, a))
        d["c"] += s["c"]
        d["e"] = max(d["e"], s["e"])
        self.due.pop(src, None)
        self.claimed.pop(src, None)

    def add(
        self, now_ms: int, items: Sequence[Item], seen: Seen | None = None
    ) -> tuple[list[bool], list[Window | None], list[int]]:
        """See :meth:`RedisAggregateState.add`."""
        if seen is not None:
            self.seen = {d: t for d, t in self.seen.items() if t > now_ms}
            evs = sorted({i for it in items for i in it.events})
            dups = [i for i in evs if seen.digests[i] in self.seen]
            if dups:
                return [], [], dups
        spec, wm = self.spec, self.wm
        if self.wmc is not None and (wm is None or self.wmc > wm):
            wm = self.wmc
        lates: list[bool] = []
        ups: list[Window | None] = []
        max_t: int | None = None
        for it in items:
            wid = None
            if spec.gap_ms:
                starts = self.sessions.get(it.key, [])
                hit = [
                    s
                    for s in starts
                    if s < it.end and it.start < self.windows[_wid(s, it.key)]["e"]
                ]
                if hit or wm is None or it.end + spec.lateness_ms > wm:
                    s0 = min([it.start, *hit])
                    wid = _wid(s0, it.key)
                    for s in hit:
                        if s != s0:
                            self._merge(_wid(s, it.key), wid)
                    self.sessions[it.key] = [s for s in starts if s not in hit] + [s0]
            elif wm is None or it.end + spec.lateness_ms > wm:
                wid = _wid(it.start, it.key)
            if wid is None:
                lates.append(True)
                ups.append(None)
                continue
            w = self.windows.setdefault(wid, self._new())
            for a, p in enumerate(it.partials):
                self._add(w, a, p)
            w["c"] += it.count
            w["e"] = max(w["e"], it.end)
            self.due[wid] = w["e"] + spec.lateness_ms
            max_t = it.max_t if max_t is None else max(max_t, it.max_t)
            lates.append(False)
            ups.append(self.values(wid) if spec.update else None)
            if seen is not None:
                self.seen.update((seen.digests[i], now_ms + seen.ttl_ms) for i in it.events)
        if max_t is not None and (self.wm is None or max_t > self.wm):
            self.wm, self.wmw = max_t, now_ms
        return lates, ups, []

    def claim(self, now_ms: int, lease_ms: int, limit: int) -> list[Window]:
        """See :meth:`RedisAggregateState.claim`."""
        eff: int | None = None
        if self.spec.processing:
            eff = now_ms
        elif self.wm is not None:
            eff = self.wm + max(0, now_ms - self.wmw - self.spec.idle_ms)
        if eff is not None and self.wmc is not None:
            eff = max(eff, self.wmc)
        self.wmc = eff
        lapsed = sorted((t, w) for w, t in self.claimed.items() if t <= now_ms)[:limit]
        due = [] if eff is None else sorted((t, w) for w, t in self.due.items() if t <= eff)[:limit]
        out = []
        for _, wid in lapsed + due:
            self.due.pop(wid, None)
            self.claimed[wid] = now_ms + lease_ms
            if self.spec.gap_ms:
                start, _, key = wid.partition(":")
                rest = [s for s in self.sessions.get(key, []) if s != int(start)]
                if rest:
                    self.sessions[key] = rest
                else:
                    self.sessions.pop(key, None)
            out.append(self.values(wid))
        return out

    def ack(self, wids: Sequence[str]) -> None:
        """Forget emitted windows."""
        for wid in wids:
            self.windows.pop(wid, None)
            self.due.pop(wid, None)
            self.claimed.pop(wid, None)

    def forget_watermark(self) -> None:
        """Start the watermark afresh (after :meth:`AggregateStep.flush`)."""
        self.wm = self.wmc = None

    def figures(self) -> dict[str, int]:
        """Open windows, windows being emitted, and the state's size (windows x fields)."""
        fields = sum(2 + 2 * len(self.spec.ops) for _ in self.windows)
        return {
            "open_windows": len(self.due),
            "closing_windows": len(self.claimed),
            "state_fields": fields,
            "applied_ids": len(self.seen),
        }


def _copy(v: Any) -> Any:
    if isinstance(v, (list, set)):
        return type(v)(v)
    return v


def dumps(value: Any) -> str:
    """A value's JSON text as partials carry it (one line, keys sorted)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
