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
from eventbus.pipelines.steps._join_watermark import LUA, PROCESSING, Clock

__all__ = [
    "AFTER_MATCH",
    "EVICTED",
    "SUPERSEDED",
    "WAITING",
    "JoinState",
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


def now_ms() -> int:
    """Wall-clock milliseconds."""
    return int(time.time() * 1000)
