"""Join state: in Redis (Lua scripts, atomic per batch) or in memory (tests, ``eventbus test``).

Per join step, under the prefix ``eventbus:join:{<pipeline>:<step>}:`` (one hash tag: one
Redis Cluster slot per step):

* ``k:<key>``: a hash of side name -> the side's event (JSON), ``__t0`` (first arrival, ms),
  ``__done`` once every side arrived and ``__by`` (side/id of the event that completed it),
  kept a window longer so that the completing event, consumed again after a crash, re-emits
  the same joined event (the sink's dedupe drops it if it was delivered); the other sides'
  events consumed again emit nothing, ``__evicted`` when pushed out by
  ``max_pending``; it expires on its own after the window;
* ``due``: a sorted set of waiting keys by deadline; ``claim``: keys a sweeper took, by lease
  deadline (a sweeper that dies mid-way is replaced when its lease runs out).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from eventbus.errors import StateUnavailableError
from eventbus.pipelines.steps._join_watermark import LUA, PROCESSING, Clock, Watermark

__all__ = [
    "AFTER_MATCH",
    "EVICTED",
    "SUPERSEDED",
    "WAITING",
    "JoinState",
    "MemoryJoinState",
    "RedisJoinState",
    "call_script",
    "connect",
]

#: What a batch adds: (key, side, event JSON, event id, time ms, lane).
Item = tuple[str, str, bytes, str, int, str]

#: Why an ``emit: first`` event waits (see :meth:`JoinState.join`); an event late by the
#: watermark (``time: event``) is not stored and gets the watermark negated (a number < 0).
WAITING, SUPERSEDED, AFTER_MATCH, EVICTED = 0, 1, 2, 3

# Every script declares its keys in KEYS (``due``/``claim`` first, then one ``k:<key>`` per
# item). The keys a script finds in a sorted set (eviction, claims) are not known before it
# runs: it names them from the declared ``due`` key's prefix, so they share its hash tag and
# its Redis Cluster slot (allowed for undeclared keys of the script's own slot).

_JOIN = (
    LUA
    + """
local due, WM = KEYS[1], KEYS[2]
local prefix = string.sub(due, 1, -4)
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local nsides = tonumber(ARGV[3])
local maxp = tonumber(ARGV[4])
local event, lateness, idle = ARGV[5] == '1', tonumber(ARGV[6]), tonumber(ARGV[7])
local w0 = event and wm_read(WM, now, idle)
local seen = {}
local out = {}
for i = 8, #ARGV, 6 do
  local k = ARGV[i]
  local h = KEYS[3 + (i - 8) / 6]
  local by = ARGV[i + 1] .. '/' .. ARGV[i + 3]
  local t = tonumber(ARGV[i + 4])
  if redis.call('HEXISTS', h, '__done') == 1 then
    -- consumed again after a crash: only the event that completed the key emits it again
    if redis.call('HGET', h, '__by') == by then
      out[#out + 1] = redis.call('HGETALL', h)
    else
      out[#out + 1] = 2
    end
  elseif w0 and t + window + lateness < w0 and redis.call('HGET', h, ARGV[i + 1]) ~= ARGV[i + 2] then
    out[#out + 1] = -w0  -- late (an event stored before is consumed again, not late)
  elseif redis.call('HEXISTS', h, '__evicted') == 1 then
    redis.call('HSET', h, ARGV[i + 1], ARGV[i + 2])
    out[#out + 1] = 3
  else
    if event and (not seen[ARGV[i + 5]] or seen[ARGV[i + 5]] < t) then seen[ARGV[i + 5]] = t end
    local new = redis.call('EXISTS', h) == 0
    local added = redis.call('HSET', h, ARGV[i + 1], ARGV[i + 2])
    if new then
      redis.call('HSET', h, '__t0', t)
      redis.call('ZADD', due, t + window + lateness, k)
      if not event then redis.call('PEXPIRE', h, 2 * window + 60000) end
    end
    if redis.call('HLEN', h) - 1 >= nsides then
      redis.call('HSET', h, '__done', '1', '__by', by)
      redis.call('ZREM', due, k)
      redis.call('PEXPIRE', h, window + lateness + 60000)
      out[#out + 1] = redis.call('HGETALL', h)
    else
      out[#out + 1] = 1 - added
    end
  end
end
if event then wm_advance(WM, seen, now, idle) end
local over = redis.call('ZCARD', due) - maxp
if over > 0 then
  for _, k in ipairs(redis.call('ZRANGE', due, 0, over - 1)) do
    redis.call('HSET', prefix .. 'k:' .. k, '__evicted', '1')
    redis.call('ZADD', due, 0, k)
  end
end
return out
"""
)

# mode latest: the table side's latest event per key (it lives window_s); with event time an
# event (of any side) late by the watermark gets the watermark negated and is not stored.
_LATEST = (
    LUA
    + """
local WM = KEYS[1]
local window = tonumber(ARGV[1])
local table_side = ARGV[2]
local now, event, lateness, idle = tonumber(ARGV[3]), ARGV[4] == '1', tonumber(ARGV[5]), tonumber(ARGV[6])
local w0 = event and wm_read(WM, now, idle)
local seen = {}
local out = {}
for i = 7, #ARGV, 4 do
  local h = KEYS[2 + (i - 7) / 4]
  local t, lane = tonumber(ARGV[i + 2]), ARGV[i + 3]
  if w0 and t + window + lateness < w0 then
    out[#out + 1] = -w0
  else
    if event and (not seen[lane] or seen[lane] < t) then seen[lane] = t end
    if ARGV[i] == table_side then
      redis.call('HSET', h, table_side, ARGV[i + 1])
      redis.call('PEXPIRE', h, window)
      out[#out + 1] = false
    else
      out[#out + 1] = redis.call('HGET', h, table_side)
    end
  end
end
if event then wm_advance(WM, seen, now, idle) end
return out
"""
)

_CLAIM = (
    LUA
    + """
local due, claim, WM = KEYS[1], KEYS[2], KEYS[3]
local prefix = string.sub(due, 1, -4)
local now = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local upto = now
if ARGV[4] == '1' then upto = wm_advance(WM, {}, now, tonumber(ARGV[5])) or -1 end
local out = {}
local lists = {redis.call('ZRANGEBYSCORE', claim, '-inf', now, 'LIMIT', 0, limit),
               redis.call('ZRANGEBYSCORE', due, '-inf', upto, 'LIMIT', 0, limit)}
for _, list in ipairs(lists) do
  for _, k in ipairs(list) do
    redis.call('ZREM', due, k)
    redis.call('ZADD', claim, now + lease, k)
    out[#out + 1] = k
    out[#out + 1] = redis.call('HGETALL', prefix .. 'k:' .. k)
  end
end
return out
"""
)

_ACK = """
for i = 1, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('DEL', KEYS[1 + i])
end
return #ARGV
"""


class JoinState(Protocol):
    """Where a join step keeps its waiting events."""

    def join(
        self,
        now_ms: int,
        window_ms: int,
        nsides: int,
        max_pending: int,
        items: Sequence[Item],
        clock: Clock = PROCESSING,
    ) -> list[dict[str, bytes] | int]:
        """Add (key, side, event JSON, event id, time ms, lane) items; per item the key's
        hash when this item completes the key (or is the completing event consumed again),
        else why it waits: :data:`WAITING`, :data:`SUPERSEDED` (it replaced an earlier event
        of its side), :data:`AFTER_MATCH` (the key had matched already: ignored),
        :data:`EVICTED`, or the watermark negated (late: not stored)."""

    def latest(
        self,
        window_ms: int,
        table: str,
        items: Sequence[Item],
        now_ms: int = 0,
        clock: Clock = PROCESSING,
    ) -> list[bytes | int | None]:
        """Store table-side items; per other item the table's latest event for its key;
        the watermark negated for an item late by it."""

    def claim_due(
        self, now_ms: int, lease_ms: int, limit: int, clock: Clock = PROCESSING
    ) -> list[tuple[str, dict[str, bytes]]]:
        """Take the keys whose window closed (by the watermark with ``clock.event``) or
        were evicted; (key, hash) each."""

    def ack(self, keys: Sequence[str]) -> None:
        """Forget claimed keys once their results were delivered."""

    def pending(self) -> int:
        """Keys waiting."""


def connect(redis_url: str) -> Any:
    """A Redis client for step state."""
    from eventbus._internal.redis_client import connect as connect_redis

    return connect_redis(redis_url, socket_timeout=10, socket_connect_timeout=5)


def call_script(script: Any, keys: list[str], args: list[Any]) -> Any:
    """Run a registered Lua script on ``keys`` (one hash tag: one Redis Cluster slot).

    Raises:
        StateUnavailableError: Redis does not answer (the batch is dispatched again later).
    """
    import redis

    try:
        return script(keys=keys, args=args)
    except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as e:
        msg = f"join state in Redis is unavailable ({type(e).__name__}: {e}); the batch will be retried"
        raise StateUnavailableError(msg) from None


def _pairs(flat: list[Any]) -> dict[str, bytes]:
    return {
        flat[i].decode() if isinstance(flat[i], bytes) else flat[i]: flat[i + 1]
        for i in range(0, len(flat), 2)
    }


class RedisJoinState:
    """Join state in Redis, each batch one atomic Lua call.

    Raises (every method):
        StateUnavailableError: Redis does not answer (the batch is dispatched again later).
    """

    def __init__(self, redis_url: str, prefix: str) -> None:
        self._redis = connect(redis_url)
        self.prefix = prefix
        self._join = self._redis.register_script(_JOIN)
        self._latest = self._redis.register_script(_LATEST)
        self._claim = self._redis.register_script(_CLAIM)
        self._ack = self._redis.register_script(_ACK)

    def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        return call_script(script, keys, args)

    def join(
        self,
        now_ms: int,
        window_ms: int,
        nsides: int,
        max_pending: int,
        items: Sequence[Item],
        clock: Clock = PROCESSING,
    ) -> list[dict[str, bytes] | int]:
        args: list[Any] = [now_ms, window_ms, nsides, max_pending, *clock.args()]
        hashes = self.prefix + "k:"
        names = [self.prefix + "due", self.prefix + "wm"]
        for item in items:
            args += item
            names.append(hashes + item[0])
        return [r if isinstance(r, int) else _pairs(r) for r in self._call(self._join, names, args)]

    def latest(
        self,
        window_ms: int,
        table: str,
        items: Sequence[Item],
        now_ms: int = 0,
        clock: Clock = PROCESSING,
    ) -> list[bytes | int | None]:
        args: list[Any] = [window_ms, table, now_ms, *clock.args()]
        hashes = self.prefix + "k:"
        names = [self.prefix + "wm"]
        for k, side, payload, _, t, lane in items:
            args += [side, payload, t, lane]
            names.append(hashes + k)
        return list(self._call(self._latest, names, args))

    def claim_due(
        self, now_ms: int, lease_ms: int, limit: int, clock: Clock = PROCESSING
    ) -> list[tuple[str, dict[str, bytes]]]:
        flat = self._call(
            self._claim,
            [self.prefix + "due", self.prefix + "claim", self.prefix + "wm"],
            [now_ms, lease_ms, limit, int(clock.event), clock.idle_ms],
        )
        return [(flat[i].decode(), _pairs(flat[i + 1])) for i in range(0, len(flat), 2)]

    def ack(self, keys: Sequence[str]) -> None:
        if keys:
            hashes = self.prefix + "k:"
            names = [self.prefix + "claim", *(hashes + k for k in keys)]
            self._call(self._ack, names, list(keys))

    def pending(self) -> int:
        try:
            return int(self._redis.zcard(self.prefix + "due"))
        except Exception:  # noqa: BLE001 - a gauge
            return -1


class MemoryJoinState:
    """The same semantics in process memory (pipeline tests without a stack)."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, bytes]] = {}
        self.due: dict[str, int] = {}
        self.claimed: dict[str, int] = {}
        self.watermark: Watermark | None = None

    def _watermark(self, clock: Clock) -> Watermark:
        if self.watermark is None:
            self.watermark = Watermark(clock.idle_ms)
        return self.watermark

    def join(
        self,
        now_ms: int,
        window_ms: int,
        nsides: int,
        max_pending: int,
        items: Sequence[Item],
        clock: Clock = PROCESSING,
    ) -> list[dict[str, bytes] | int]:
        out: list[dict[str, bytes] | int] = []
        wm = self._watermark(clock)
        w0 = wm.read(now_ms) if clock.event else None
        lateness = clock.lateness_ms
        seen: list[tuple[str, int]] = []
        for k, side, payload, eid, t, lane in items:
            by = f"{side}/{eid}".encode()
            h = self.hashes.get(k)
            if h is not None and "__done" in h:
                out.append(dict(h) if h.get("__by") == by else AFTER_MATCH)
                continue
            if (
                w0 is not None
                and t + window_ms + lateness < w0
                and (h is None or h.get(side) != payload)
            ):
                out.append(-w0)
                continue
            if clock.event and (h is None or "__evicted" not in h):
                seen.append((lane, t))
            if h is None:
                h = self.hashes[k] = {"__t0": str(t).encode()}
                self.due[k] = t + window_ms + lateness
            replaced = side in h
            h[side] = payload
            if "__evicted" in h:
                out.append(EVICTED)
            elif len(h) - 1 >= nsides:
                h["__done"] = b"1"
                h["__by"] = by
                self.due.pop(k, None)
                out.append(dict(h))
            else:
                out.append(SUPERSEDED if replaced else WAITING)
        if clock.event:
            wm.advance(seen, now_ms)
        over = len(self.due) - max_pending
        if over > 0:
            for k in sorted(self.due, key=self.due.__getitem__)[:over]:
                self.hashes[k]["__evicted"] = b"1"
                self.due[k] = 0
        return out

    def latest(
        self,
        window_ms: int,
        table: str,
        items: Sequence[Item],
        now_ms: int = 0,
        clock: Clock = PROCESSING,
    ) -> list[bytes | int | None]:
        out: list[bytes | int | None] = []
        wm = self._watermark(clock)
        w0 = wm.read(now_ms) if clock.event else None
        seen: list[tuple[str, int]] = []
        for k, side, payload, _, t, lane in items:
            if w0 is not None and t + window_ms + clock.lateness_ms < w0:
                out.append(-w0)
                continue
            seen.append((lane, t))
            if side == table:
                self.hashes.setdefault(k, {})[table] = payload
                out.append(None)
            else:
                out.append(self.hashes.get(k, {}).get(table))
        if clock.event:
            wm.advance(seen, now_ms)
        return out

    def claim_due(
        self, now_ms: int, lease_ms: int, limit: int, clock: Clock = PROCESSING
    ) -> list[tuple[str, dict[str, bytes]]]:
        upto = now_ms
        if clock.event:
            w = self._watermark(clock).advance((), now_ms)
            upto = -1 if w is None else w
        keys = [k for k, t in self.claimed.items() if t <= now_ms] + [
            k for k, t in self.due.items() if t <= upto
        ]
        out = []
        for k in keys[:limit]:
            self.due.pop(k, None)
            self.claimed[k] = now_ms + lease_ms
            out.append((k, dict(self.hashes.get(k, {}))))
        return out

    def ack(self, keys: Sequence[str]) -> None:
        for k in keys:
            self.claimed.pop(k, None)
            self.hashes.pop(k, None)

    def pending(self) -> int:
        return len(self.due)


def now_ms() -> int:
    """Wall-clock milliseconds."""
    return int(time.time() * 1000)
