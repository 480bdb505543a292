"""The aggregate step's state in Redis: three Lua scripts, each one atomic call.

Every key a script touches is declared in KEYS (:func:`eventbus._internal.keys.aggregate_keys`,
one hash tag per pipeline and step, so the scripts run on one Redis Cluster slot):
``w`` (hash) holds every open window's fields, the watermark (``wm``: the latest event time
merged, ``wmw``: the wall clock when it last moved, ``wmc``: the watermark the timer reached,
which the clock also moves once no event moved ``wm`` for ``idle_timeout_s``) and each session key's open session starts (``S\\0<key>``);
``due`` orders windows by close deadline, ``claim`` holds windows being emitted (by lease
deadline); ``hll``/``hll2`` are scratch strings a HyperLogLog is loaded into (a window's HLL
itself is a field of ``w``, so no key is made up inside a script); ``seen`` holds the digests
of applied events (dedupe, exactly_once); under exactly_once ``w``'s field ``X\\0<digest>``
holds the values of the windows that event closed, ``closed`` orders those fields by when
they are forgotten (see :mod:`._aggregate_close`).

A window ``<start>:<key>`` has fields ``<wid>\\0c`` (events), ``<wid>\\0e`` (end, ms) and per
aggregation ``a`` (1-based) ``<wid>\\0<a>`` plus ``n``/``t``/``x`` suffixed ones (see
:mod:`._aggregate_ops` for the partial formats the scripts merge).

The lean layout: with tumbling or hopping windows, a ``count`` aggregation and ``emit:
close``, a window has no ``c`` field: the count's own field is its event count (a third of an
item's writes fewer). The previous script version, a canary beside this one, reads such
windows right: it takes the count from the count's field too, and ``c`` only for ``emit:
update`` ids and to tell a new window, whose end and due entry it then writes again with the
same values (``tests/unit/pipelines/test_aggregate_canary.py`` runs both on one state).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from eventbus._internal import keys
from eventbus.pipelines.steps._aggregate_ops import Item, Seen, Spec, Window
from eventbus.pipelines.steps._aggregate_scripts import ACK, ADD, CLAIM
from eventbus.pipelines.steps._join_state import call_script, connect

__all__ = ["RedisAggregateState"]

_FIGURES = ("open_windows", "closing_windows", "state_fields", "state_bytes", "applied_ids")


def _window(row: bytes | str) -> Window:
    # the script's values(): id, count, end, the aggregations' values, each NUL-terminated
    s = (row.decode() if isinstance(row, bytes) else row).split("\0")
    return Window(s[0], int(s[1]), int(s[2]), s[3:-1])


class RedisAggregateState:
    """Aggregate state in Redis (see the module docstring): one script call per batch.

    Raises (every method):
        StateUnavailableError: Redis does not answer (the batch is dispatched again later).
    """

    def __init__(self, redis_url: str, pipeline: str, step: str, spec: Spec) -> None:
        self._redis = connect(redis_url)
        self.keys = keys.aggregate_keys(pipeline, step)
        self.spec = spec
        self._header: list[Any] = [len(spec.ops), *spec.ops, *spec.maxes]
        self._add = self._redis.register_script(ADD)
        self._claim = self._redis.register_script(CLAIM)
        self._ack = self._redis.register_script(ACK)

    def _call(self, script: Any, args: list[Any]) -> Any:
        return call_script(script, self.keys, args)

    def add(
        self, now_ms: int, items: Sequence[Item], seen: Seen | None = None
    ) -> tuple[list[bool], list[Window | None], list[int]]:
        """Merge the batch's window partials; per item whether it was late, and (emit:
        update) the window's values after it. With ``seen`` (``delivery.dedupe``): when an
        event of the batch was applied before, nothing is merged and the third list names
        those events (batch indexes); otherwise the applied events are remembered."""
        lates, windows, dups, _ = self._add_call(now_ms, items, seen, closing=False)
        return lates, windows, dups

    def add_closing(
        self, now_ms: int, items: Sequence[Item], seen: Seen, limit: int = 5000
    ) -> tuple[list[bool], list[Window | None], list[int], dict[int, list[Window]]]:
        """:meth:`add` under ``exactly_once`` (see :mod:`._aggregate_close`): the call also
        closes the windows due by the watermark after the batch, recorded as closed by the
        batch's last applied event; the fourth value maps a batch index to the windows its
        event closed: this call's closer, or (with duplicates) events applied before whose
        record still holds the windows they closed then. At most ``limit`` windows close in
        one call; the others stay due for the next batches."""
        return self._add_call(now_ms, items, seen, closing=True, limit=limit)

    def _add_call(
        self,
        now_ms: int,
        items: Sequence[Item],
        seen: Seen | None,
        *,
        closing: bool,
        limit: int = 0,
    ) -> tuple[list[bool], list[Window | None], list[int], dict[int, list[Window]]]:
        spec = self.spec
        order: list[int] = []
        digests: list[str] = []
        ttl = 0
        if seen is not None:
            order = sorted({i for it in items for i in it.events})
            digests = [seen.digests[i] for i in order]
            ttl = seen.ttl_ms
        pos = {i: n + 1 for n, i in enumerate(order)}
        args = [*self._header, now_ms, spec.lateness_ms, spec.gap_ms, int(spec.update)]
        args += [ttl, len(digests), "".join(digests)]
        fields: list[str | int] = []
        for it in items:
            evs = " ".join(str(pos[i]) for i in it.events) if seen is not None else ""
            fields += [it.key, str(it.start), it.end, it.max_t, it.count, evs]
            fields += it.partials
        args.append(orjson.dumps(fields))
        args += [int(closing), limit]
        lates, ups, dups, closed, closers = self._call(self._add, args)
        flags = lates.decode() if isinstance(lates, bytes) else str(lates)
        merged = iter([_window(u) for u in ups])  # emit: update: per merged item its values
        windows = [None if f == "1" or not ups else next(merged) for f in flags]
        by: dict[int, list[Window]] = {}
        for text, p in zip(closed, closers):
            by.setdefault(order[int(p) - 1], []).extend(_window(v) for v in orjson.loads(text))
        return [f == "1" for f in flags], windows, [order[int(p) - 1] for p in dups], by

    def claim(self, now_ms: int, lease_ms: int, limit: int) -> list[Window]:
        """Close the windows due by the watermark (advanced by the wall clock meanwhile) and
        take them, and windows whose earlier claim lapsed, for emission."""
        spec = self.spec
        args = [*self._header, now_ms, lease_ms, limit, int(spec.processing), int(spec.gap_ms > 0)]
        args.append(spec.idle_ms)
        return [_window(row) for row in self._call(self._claim, args)]

    def ack(self, wids: Sequence[str]) -> None:
        """Forget emitted windows."""
        if wids:
            self._call(self._ack, [*self._header, *wids])

    def forget_watermark(self) -> None:
        """Start the watermark afresh (after :meth:`AggregateStep.flush`)."""
        call_script(
            lambda keys, args: self._redis.hdel(keys[0], *args), self.keys, ["wm", "wmw", "wmc"]
        )

    def figures(self) -> dict[str, int]:
        """Open windows, windows being emitted, and the state's size in hash fields."""
        w, due, claim = self.keys[:3]
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.zcard(due).zcard(claim).hlen(w).memory_usage(w).zcard(self.keys[5])
            n_due, n_claim, fields, size, n_seen = pipe.execute()
        except Exception:  # noqa: BLE001 - a gauge
            return dict.fromkeys(_FIGURES, -1)
        return {
            "open_windows": n_due,
            "closing_windows": n_claim,
            "state_fields": fields,
            "state_bytes": size or 0,
            "applied_ids": n_seen,
        }
