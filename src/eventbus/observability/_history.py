"""Each pipeline's last 15 minutes, kept bounded in Redis: the dashboard's charts.

Writers are the processes that publish figures (replicas, source actors, gateways; see
:mod:`eventbus.observability._view`). Each keeps a :class:`HistoryRecorder` beside its stats
entry, and every time it writes the entry (when its figures changed, or at the 5 s heartbeat:
never per event or batch, and nothing more for an idle pipeline) the recorder adds, in the
same Redis round trip, what happened since its last write to the current
:data:`BUCKET_S`-second bucket: ``HINCRBY`` of the events in, out and failed and of the
end-to-end latency histogram's buckets, ``HSET`` of its lag (the highest it wrote in the
bucket) and, for a replica, that it was alive. Bucket keys (:func:`keys.history`) expire
after :data:`TTL_S`, so a pipeline holds at most ``TTL_S / BUCKET_S`` small hashes.

:func:`read_history` turns the buckets into columns: per bucket its start, events in/out/
failed per second, p50/p99 latency (the merged histogram deltas), consumer lag (the writers'
lags summed) and replicas (the replicas that wrote in it: a live replica writes at least every
heartbeat, so every bucket of its life, and a pipeline scaled to zero has none). A scale to
zero, a cold start or a lag spike shows as a step in these columns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from eventbus._internal import keys
from eventbus.observability._metrics import LATENCY_BOUNDS_S, quantile

__all__ = [
    "BUCKET_S",
    "TTL_S",
    "WINDOW_S",
    "HistoryRecorder",
    "bucket_keys",
    "history_columns",
    "bucket_row",
    "read_history",
    "read_rows",
    "settled_starts",
]

#: Seconds per history bucket (one chart point). A writer writes at least every 5 s (the
#: heartbeat) plus its 1 s publishing tick, so each bucket of a live writer's life has a write.
BUCKET_S = 10
#: Seconds of history kept and shown (15 minutes).
WINDOW_S = 900
#: Lifetime of a bucket key: the window and two buckets of margin.
TTL_S = WINDOW_S + 2 * BUCKET_S
#: A bucket is shown once this long after its end: writers publish once a second.
_SETTLE_S = 2.0

_COUNTERS = ("in", "out", "failed")
#: entry role -> (its counters' names, in :data:`_COUNTERS` order)
_SOURCE_NAMES = ("consumed", "outputs", "failed")


def _bucket(t: float) -> int:
    return int(t // BUCKET_S) * BUCKET_S


def bucket_keys(pipeline: str, now: float | None = None) -> list[str]:
    """Every bucket key of ``pipeline`` that may exist now (oldest first): what a delete
    removes."""
    now = time.time() if now is None else now
    last = _bucket(now) + BUCKET_S  # a writer's clock may run ahead a little
    first = last - TTL_S - BUCKET_S
    return [keys.history(pipeline, t) for t in range(first, last + 1, BUCKET_S)]


def _figures(body: dict[str, Any]) -> tuple[list[int], list[int], int | None]:
    """Cumulative counters (in, out, failed), latency histogram counts, and lag (None: the
    writer consumes nothing) of one stats entry body."""
    counters = [0, 0, 0]
    hist = [0] * (len(LATENCY_BOUNDS_S) + 1)
    lag: int | None = None
    if body.get("role") == "gateway":
        sync = body.get("sync") or {}
        counters = [int(sync.get(n, 0)) for n in _SOURCE_NAMES]
        return counters, hist, None
    for src in body.get("sources") or []:
        for i, n in enumerate(_SOURCE_NAMES):
            counters[i] += int(src.get(n, 0))
    # what the steps' timers delivered (closed windows) is out too, as in the totals
    counters[1] += int((body.get("metrics") or {}).get("timer_outputs") or 0)
    for m in (body.get("metrics") or {}).get("sources") or []:
        lat = m.get("latency") or {}
        if list(lat.get("bounds", ())) == list(LATENCY_BOUNDS_S):
            for i, c in enumerate(lat.get("counts", ())[: len(hist)]):
                hist[i] += int(c)
        lag = (lag or 0) + sum(int(v) for v in (m.get("lag") or {}).values())
    return counters, hist, lag


class HistoryRecorder:
    """One writer's side of the history: the figures it last recorded, to add only what is new.

    Args:
        pipeline: whose history.
        field: the writer's stats entry field (unique per process and publisher).

    Example:
        >>> r = HistoryRecorder("orders", "replica-1")
        >>> cmds = r.commands({"sources": [{"consumed": 5, "outputs": 4}]}, now=1000.0)
        >>> [c for c in cmds if c[0] == "hincrby"]
        [('hincrby', 'eventbus:history:{orders}:1000', 'in', 5), ('hincrby', 'eventbus:history:{orders}:1000', 'out', 4)]
    """

    def __init__(self, pipeline: str, field: str) -> None:
        self.pipeline = pipeline
        self.field = field
        self._counters = [0, 0, 0]
        self._hist = [0] * (len(LATENCY_BOUNDS_S) + 1)
        self._lag_bucket = -1
        self._lag_max = 0

    def commands(self, body: dict[str, Any], now: float | None = None) -> list[tuple[Any, ...]]:
        """The Redis commands that add ``body`` (a stats entry, cumulative figures) to the
        current bucket, as ``(method, *args)`` of a redis-py client; none when nothing is new.
        Counts as recorded."""
        now = time.time() if now is None else now
        counters, hist, lag = _figures(body)
        bucket = _bucket(now)
        key = keys.history(self.pipeline, bucket)
        out: list[tuple[Any, ...]] = []
        # Counters of one writer only grow; one that went down was reset (a gateway forgets
        # a deleted pipeline's counts): all of it is new.
        for name, cur, last in zip(_COUNTERS, counters, self._counters):
            if cur != last and (new := cur - last if cur > last else cur):
                out.append(("hincrby", key, name, new))
        for i, (cur, last) in enumerate(zip(hist, self._hist)):
            if cur != last and (new := cur - last if cur > last else cur):
                out.append(("hincrby", key, f"h{i}", new))
        self._counters, self._hist = counters, hist
        if lag is not None:
            if bucket != self._lag_bucket:
                self._lag_bucket, self._lag_max = bucket, lag
            self._lag_max = max(self._lag_max, lag)
            out.append(("hset", key, f"lag:{self.field}", self._lag_max))
        if body.get("role", "replica") == "replica":
            out.append(("hset", key, f"up:{self.field}", 1))
        if out:
            out.append(("expire", key, TTL_S))
        return out

    def queue(self, pipe: Any, body: dict[str, Any], now: float | None = None) -> None:
        """Queue :meth:`commands` on a redis-py pipeline (sync or asyncio, cluster or not:
        every bucket key shares the pipeline's hash tag with its stats key) as one ``EVAL``
        (one command however many figures moved: each command costs the writer ~50 us of
        redis-py here)."""
        cmds = self.commands(body, now)
        if not cmds:
            return
        key = cmds[-1][1]
        incr = [a for c in cmds if c[0] == "hincrby" for a in c[2:]]
        sets = [a for c in cmds if c[0] == "hset" for a in c[2:]]
        pipe.eval(_WRITE_LUA, 1, key, TTL_S, len(incr) // 2, *incr, *sets)


# KEYS[1]: the bucket; ARGV: TTL, n, n (field, increment) pairs, then (field, value) pairs.
_WRITE_LUA = """
local k = KEYS[1]
local n = tonumber(ARGV[2])
for i = 3, 2 + 2 * n, 2 do redis.call('HINCRBY', k, ARGV[i], ARGV[i + 1]) end
if #ARGV > 2 + 2 * n then redis.call('HSET', k, unpack(ARGV, 3 + 2 * n)) end
redis.call('EXPIRE', k, ARGV[1])
return 1
"""

#: A bucket read back as one row of integers: in, out, failed, the latency histogram's
#: counts, the writers' lags summed, how many writers had a lag, replicas alive.
_ROW = 3 + len(LATENCY_BOUNDS_S) + 1 + 3

# KEYS: bucket keys; ARGV[1]: histogram buckets. One row (see _ROW) per key, summed in Redis,
# so that the gateway parses 22 integers per bucket, not every writer's fields.
_READ_LUA = """
local nb = tonumber(ARGV[1])
local out = {}
for i, k in ipairs(KEYS) do
  local h = redis.call('HGETALL', k)
  local row = {0, 0, 0}
  for j = 1, nb do row[3 + j] = 0 end
  local lag, lagn, up = 0, 0, 0
  for j = 1, #h, 2 do
    local f, v = h[j], tonumber(h[j + 1])
    if f == 'in' then row[1] = v
    elseif f == 'out' then row[2] = v
    elseif f == 'failed' then row[3] = v
    elseif string.sub(f, 1, 4) == 'lag:' then lag = lag + v; lagn = lagn + 1
    elseif string.sub(f, 1, 3) == 'up:' then up = up + 1
    elseif string.sub(f, 1, 1) == 'h' then
      local b = tonumber(string.sub(f, 2))
      if b ~= nil and b >= 0 and b < nb then row[4 + b] = v end
    end
  end
  row[nb + 4] = lag
  row[nb + 5] = lagn
  row[nb + 6] = up
  out[i] = row
end
return out
"""


def bucket_row(h: dict[Any, Any]) -> list[int]:
    """A bucket's hash as the read script returns it (``_READ_LUA`` does this in Redis)."""
    nb = len(LATENCY_BOUNDS_S) + 1
    row = [0] * _ROW
    for k, v in h.items():
        f, n = _text(k), int(v)
        if f in _COUNTERS:
            row[_COUNTERS.index(f)] = n
        elif f.startswith("lag:"):
            row[3 + nb] += n
            row[4 + nb] += 1
        elif f.startswith("up:"):
            row[5 + nb] += 1
        elif f.startswith("h") and f[1:].isdigit() and int(f[1:]) < nb:
            row[3 + int(f[1:])] = n
    return row


def history_columns(
    buckets: Sequence[tuple[int, list[int] | dict[Any, Any]]],
    now: float,
    window_s: int = WINDOW_S,
) -> dict[str, Any]:
    """Chart columns from ``(bucket start, row)`` pairs, a row as :func:`bucket_row` makes
    it or the bucket's hash (any order; missing buckets count as empty: nothing ran).

    Returns:
        ``bucket_s``, ``window_s``, and one list per column, one entry per settled bucket in
        the window, oldest first: ``t`` (bucket start, epoch s), ``in_per_s``, ``out_per_s``,
        ``failed_per_s``, ``p50_s``/``p99_s`` (None without deliveries), ``lag`` (None when no
        writer consumed: no replica ran) and ``replicas``.
    """
    starts = settled_starts(now, window_s)
    count = len(starts)
    by_start = {t: (bucket_row(r) if isinstance(r, dict) else r) for t, r in buckets}
    cols: dict[str, list[Any]] = {
        c: []
        for c in ("t", "in_per_s", "out_per_s", "failed_per_s", "p50_s", "p99_s", "lag", "replicas")
    }
    nb = len(LATENCY_BOUNDS_S) + 1
    empty = [0] * _ROW
    for t in starts:
        row = by_start.get(t) or empty
        cols["t"].append(t)
        for i, name in enumerate(_COUNTERS):
            cols[f"{name}_per_s"].append(row[i] / BUCKET_S)
        counts = row[3 : 3 + nb]
        snap = {"bounds": list(LATENCY_BOUNDS_S), "counts": counts, "count": sum(counts)}
        cols["p50_s"].append(_finite(quantile(snap, 0.5)))
        cols["p99_s"].append(_finite(quantile(snap, 0.99)))
        cols["lag"].append(row[3 + nb] if row[4 + nb] else None)
        cols["replicas"].append(row[5 + nb])
    return {"bucket_s": BUCKET_S, "window_s": count * BUCKET_S, **cols}


def settled_starts(now: float, window_s: int = WINDOW_S) -> list[int]:
    """The starts of the settled buckets of the last ``window_s`` seconds, oldest first."""
    last = _bucket(now - _SETTLE_S) - BUCKET_S  # the newest bucket that is complete
    count = max(1, window_s // BUCKET_S)
    return [last - BUCKET_S * i for i in range(count - 1, -1, -1)]


async def read_rows(redis: Any, pipeline: str, starts: Sequence[int]) -> list[list[int]]:
    """The rows (:func:`bucket_row`) of a pipeline's buckets, in one ``EVAL`` (one slot)."""
    if not starts:
        return []
    names = [keys.history(pipeline, t) for t in starts]
    rows = await redis.eval(_READ_LUA, len(names), *names, len(LATENCY_BOUNDS_S) + 1)
    return [[int(v) for v in r] for r in rows]


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


async def read_history(
    redis: Any, pipeline: str, now: float | None = None, window_s: int = WINDOW_S
) -> dict[str, Any]:
    """A pipeline's history columns (:func:`history_columns`) from Redis, in one round trip
    (``redis.asyncio``)."""
    now = time.time() if now is None else now
    starts = settled_starts(now, window_s)
    rows = await read_rows(redis, pipeline, starts)
    return history_columns(list(zip(starts, rows)), now, window_s)
