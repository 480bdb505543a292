"""Join state of ``emit: every`` and ``emit: latest``: every event of a key's window is kept.

Under the join step's prefix (``eventbus:join:{<pipeline>:<step>}:``), apart from the
``emit: first`` families of :mod:`._join_state`:

* ``w:<key>``: the key's open window, a hash of ``__t0`` (first arrival, ms), ``__n`` (events
  stored, the sequence), ``__b`` (their bytes), ``__evicted`` once pushed out by
  ``max_pending``, and ``<side>/<event id>`` -> ``<seq>,<event JSON>`` per event (seq 0: an
  event that came after the eviction, never paired);
* ``x:<t0>:<key>``: a window that closed before a sweeper took it, renamed when the key's next
  event opened a new window;
* ``pdue``: window names (``w:<key>``, ``x:<t0>:<key>``) by deadline; ``pclaim``: those a
  sweeper took, by lease deadline;
* an outer join under exactly_once (:mod:`._join_close`): windows closed by a batch, kept as
  ``x:<t0>c<n>:<key>`` with ``__closed``; ``cw``/``cwx``: the closed (or renamed) window of
  each of their events, and when it expires; ``cr``/``crx``: each closer's closed windows.

An event pairs with the events of the other sides stored *before* it (lower seq), so each
combination is emitted once, by its last event; that event consumed again after a crash finds
its own field and re-emits the same combinations (same ids: the sink's dedupe drops them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventbus.pipelines.steps._join_close import CLOSE, LOOKUP, Closing
from eventbus.pipelines.steps._join_state import call_script, connect
from eventbus.pipelines.steps._join_watermark import LUA, PROCESSING, Clock

__all__ = ["Item", "PairItem", "PairState", "RedisPairState", "split_field", "window_key"]

#: Per item: (code, t0, same-side events before it, [(side/id, seq, JSON) of the other sides]).
#: code 1: stored now; 2: stored before (consumed again); -1: its window was evicted (kept
#: for the dead-letter sink); -2: the window is full (max_key_bytes), not stored (the count
#: is then the window's bytes); -3: late by the watermark (event time), not stored (t0 is
#: then the watermark).
PairItem = tuple[int, str, int, list[tuple[str, int, bytes]]]

#: What a batch adds: (key, side, event JSON, event id, time ms, lane).
Item = tuple[str, str, bytes, str, int, str]

# KEYS: ``pdue``, ``pclaim``, ``wm`` (:mod:`._join_watermark`), then one ``w:<key>`` per item; the windows found in the sorted
# sets and the renamed ``x:<t0>:<key>`` ones are named from the declared keys' prefix (same
# hash tag, same Redis Cluster slot), as in :mod:`._join_state`.
_ADD = (
    LUA
    + """
local due, claim, WM = KEYS[1], KEYS[2], KEYS[3]
local prefix = string.sub(due, 1, -5)
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local maxp = tonumber(ARGV[3])
local maxb = tonumber(ARGV[4])
local event, lateness, idle = ARGV[5] == '1', tonumber(ARGV[6]), tonumber(ARGV[7])
local w0 = event and wm_read(WM, now, idle)
local eos, climit, cbytes, replay = ARGV[8] == '1', tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local seen = {}
local ks, fs, recs, closer = {}, {}, {}, nil
"""
    + LOOKUP
    + """
local function seen_before(h, side, seq)
  local flat = redis.call('HGETALL', h)
  local res, same = {}, 0
  for j = 1, #flat, 2 do
    local f = flat[j]
    if string.sub(f, 1, 2) ~= '__' then
      local v = flat[j + 1]
      local s = tonumber(string.sub(v, 1, string.find(v, ',', 1, true) - 1))
      if s > 0 and s < seq then
        if string.sub(f, 1, string.find(f, '/', 1, true) - 1) == side then
          same = same + 1
        else
          res[#res + 1] = f
          res[#res + 1] = v
        end
      end
    end
  end
  return same, res
end
local out = {}
for i = 12, #ARGV, 6 do
  local k, side, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local f = side .. '/' .. ARGV[i + 3]
  local t = tonumber(ARGV[i + 4])
  local m = 'w:' .. k
  local h = KEYS[4 + (i - 12) / 6]
  local got = redis.call('HMGET', h, '__t0', f, '__evicted', '__b')
  local t0, old, evicted, bytes = got[1], got[2], got[3], tonumber(got[4])
  ks[#ks + 1], fs[#fs + 1] = k, f
  local prev = not old and closed_at(k, f)
  if prev then
    -- exactly_once: consumed again after its window closed; it emits what it emitted
    local ph, same, res = prefix .. prev, 0, {}
    local v = redis.call('HGET', ph, f)
    if v then same, res = seen_before(ph, side, tonumber(string.sub(v, 1, string.find(v, ',', 1, true) - 1))) end
    out[#out + 1] = {2, redis.call('HGET', ph, '__t0') or '0', same, res}
    closer = #out
  elseif not old and w0 and t + window + lateness < w0 then
    -- late by the watermark of the batches before (an event stored before is not: it is
    -- consumed again and re-emits what it emitted)
    out[#out + 1] = {-3, string.format('%d', w0), 0, {}}
  else
  if event and not old and (not seen[ARGV[i + 5]] or seen[ARGV[i + 5]] < t) then
    seen[ARGV[i + 5]] = t
  end
  if t0 and not old and t >= tonumber(t0) + window then
    -- closed but not swept yet: it goes on as x:<t0>:<key>, this event opens a new window
    local x = 'x:' .. t0 .. ':' .. k
    redis.call('RENAME', h, prefix .. x)
    if eos then index(x, k) end  -- its events consumed again find it
    local leased = redis.call('ZSCORE', claim, m)
    redis.call('ZREM', due, m)
    if leased then
      redis.call('ZREM', claim, m)
      redis.call('ZADD', claim, leased, x)
    else
      redis.call('ZADD', due, tonumber(t0) + window + lateness, x)
    end
    t0 = false
  end
  if not t0 then
    -- a new window: nothing to pair with yet
    t0 = string.format('%d', t)
    if #payload > maxb then
      redis.call('HSET', h, '__t0', t0, '__n', 0, '__b', 0)
      out[#out + 1] = {-2, t0, 0, {}}
    else
      redis.call('HSET', h, '__t0', t0, '__n', 1, '__b', #payload, f, '1,' .. payload)
      out[#out + 1] = {1, t0, 0, {}}
      closer = #out
    end
    redis.call('ZADD', due, t + window + lateness, m)
    if not event then
      -- event time: the window lives until the watermark passes (the sweeper removes it)
      redis.call('PEXPIRE', h, 2 * window + 60000)
    end
  elseif old then
    local seq = tonumber(string.sub(old, 1, string.find(old, ',', 1, true) - 1))
    local same, res = seen_before(h, side, seq)
    out[#out + 1] = {2, t0, same, res}
    closer = #out
  elseif evicted then
    redis.call('HSET', h, f, '0,' .. payload)
    out[#out + 1] = {-1, t0, 0, {}}
  elseif bytes + #payload > maxb then
    out[#out + 1] = {-2, t0, bytes, {}}
  else
    local seq = redis.call('HINCRBY', h, '__n', 1)
    redis.call('HINCRBY', h, '__b', #payload)
    redis.call('HSET', h, f, seq .. ',' .. payload)
    local same, res = seen_before(h, side, seq)
    out[#out + 1] = {1, t0, same, res}
    closer = #out
  end
  end
end
if event then wm_advance(WM, seen, now, idle) end
"""
    + CLOSE
    + """
local over = redis.call('ZCARD', due) - maxp
if over > 0 then
  for _, m in ipairs(redis.call('ZRANGE', due, 0, over - 1)) do
    redis.call('HSET', prefix .. m, '__evicted', '1')
    redis.call('ZADD', due, 0, m)
  end
end
return out
"""
)

_CLAIM = (
    LUA
    + """
local due, claim, WM = KEYS[1], KEYS[2], KEYS[3]
local prefix = string.sub(due, 1, -5)
local now, lease, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
-- event time: windows are due by the watermark (none before the first event)
local upto = now
if ARGV[4] == '1' then upto = wm_advance(WM, {}, now, tonumber(ARGV[5])) or -1 end
-- an outer join under exactly_once: the batches close the windows, the sweeper takes only
-- the evicted ones (score 0)
local evicted_only = ARGV[6] == '1'
if evicted_only then upto = 0 end
local out = {}
for _, list in ipairs({redis.call('ZRANGEBYSCORE', claim, '-inf', now, 'LIMIT', 0, limit),
                       redis.call('ZRANGEBYSCORE', due, '-inf', upto, 'LIMIT', 0, limit)}) do
  for _, m in ipairs(list) do
    if evicted_only and redis.call('HEXISTS', prefix .. m, '__evicted') == 0 then
      -- a window of a time before 1970 (score <= 0): a batch closes it
    else
    redis.call('ZREM', due, m)
    redis.call('ZADD', claim, now + lease, m)
    out[#out + 1] = m
    out[#out + 1] = redis.call('HGETALL', prefix .. m)
    end
  end
end
return out
"""
)

# A claimed w:<key> may have been renamed x:<t0>:<key> since (the key's next event opened a
# new window): the claim's t0 tells which window to forget.
# KEYS: ``pclaim``, then the claimed window's hash per (name, t0) item of ARGV.
_ACK = """
local claim = KEYS[1]
local prefix = string.sub(claim, 1, -7)
for i = 1, #ARGV, 2 do
  local m, t0 = ARGV[i], ARGV[i + 1]
  if string.sub(m, 1, 2) == 'w:' and redis.call('HGET', KEYS[2 + (i - 1) / 2], '__t0') ~= t0 then
    redis.call('ZREM', claim, m)
    m = 'x:' .. t0 .. ':' .. string.sub(m, 3)
  end
  redis.call('ZREM', claim, m)
  redis.call('DEL', prefix .. m)
end
return 1
"""


def window_key(member: str) -> str:
    """The join key of a window name (``w:<key>`` or ``x:<t0>:<key>``)."""
    return member[2:] if member.startswith("w:") else member.split(":", 2)[2]


def _hash(flat: list[Any]) -> dict[str, bytes]:
    return {flat[j].decode(): flat[j + 1] for j in range(0, len(flat), 2)}


def split_field(field: str, value: bytes) -> tuple[str, int, bytes]:
    seq, _, payload = value.partition(b",")
    return field, int(seq), payload


class PairState:
    """What both stores offer (see the module docstring)."""

    def add(
        self,
        now_ms: int,
        window_ms: int,
        max_pending: int,
        max_bytes: int,
        items: Sequence[Item],
        clock: Clock = PROCESSING,
    ) -> list[PairItem]:
        """Add (key, side, event JSON, event id, time ms, lane) items, one :data:`PairItem`
        each (the time is the wall clock's ``now_ms`` with ``time: processing``)."""
        raise NotImplementedError

    def claim_due(
        self,
        now_ms: int,
        lease_ms: int,
        limit: int,
        clock: Clock = PROCESSING,
        *,
        evicted_only: bool = False,
    ) -> list[tuple[str, dict[str, bytes]]]:
        """Take the windows that closed (by the watermark with ``clock.event``) or were
        evicted: (window name, hash) each; ``evicted_only``: the evicted ones (an outer join
        under exactly_once, whose batches close the others)."""
        raise NotImplementedError

    def ack(self, claimed: Sequence[tuple[str, str]]) -> None:
        """Forget delivered windows, given as (window name, its ``__t0``)."""
        raise NotImplementedError

    def pending(self) -> int:
        """Open windows."""
        raise NotImplementedError


class RedisPairState(PairState):
    """In Redis, each batch one atomic Lua call (errors: ``StateUnavailableError``)."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        self._redis = connect(redis_url)
        self.prefix = prefix
        self._add = self._redis.register_script(_ADD)
        self._claim = self._redis.register_script(_CLAIM)
        self._ack = self._redis.register_script(_ACK)

    def add(
        self,
        now_ms: int,
        window_ms: int,
        max_pending: int,
        max_bytes: int,
        items: Sequence[Item],
        clock: Clock = PROCESSING,
    ) -> list[PairItem]:
        return self.add_closing(now_ms, window_ms, max_pending, max_bytes, items, clock)[0]

    def add_closing(
        self,
        now_ms: int,
        window_ms: int,
        max_pending: int,
        max_bytes: int,
        items: Sequence[Item],
        clock: Clock = PROCESSING,
        closing: Closing | None = None,
    ) -> tuple[list[PairItem], list[list[tuple[str, dict[str, bytes]]]]]:
        """:meth:`add`; with ``closing`` (an outer join under exactly_once, see
        :mod:`._join_close`) the call also closes the windows due by the watermark, and gives
        per item the closed windows it emits, (window name, hash) each."""
        eos = [1, *closing] if closing is not None else [0, 0, 0, 0]
        args: list[Any] = [now_ms, window_ms, max_pending, max_bytes, *clock.args(), *eos]
        windows = self.prefix + "w:"
        names = [self.prefix + "pdue", self.prefix + "pclaim", self.prefix + "wm"]
        for item in items:
            args += item
            names.append(windows + item[0])
        out: list[PairItem] = []
        closed: list[list[tuple[str, dict[str, bytes]]]] = []
        for code, t0, same, flat, *rest in call_script(self._add, names, args):
            others = [split_field(flat[j].decode(), flat[j + 1]) for j in range(0, len(flat), 2)]
            out.append((int(code), t0.decode(), int(same), others))
            got = rest[0] if rest else []
            closed.append([(got[j].decode(), _hash(got[j + 1])) for j in range(0, len(got), 2)])
        return out, closed

    def claim_due(
        self,
        now_ms: int,
        lease_ms: int,
        limit: int,
        clock: Clock = PROCESSING,
        *,
        evicted_only: bool = False,
    ) -> list[tuple[str, dict[str, bytes]]]:
        flat = call_script(
            self._claim,
            [self.prefix + "pdue", self.prefix + "pclaim", self.prefix + "wm"],
            [now_ms, lease_ms, limit, int(clock.event), clock.idle_ms, int(evicted_only)],
        )
        return [(flat[i].decode(), _hash(flat[i + 1])) for i in range(0, len(flat), 2)]

    def ack(self, claimed: Sequence[tuple[str, str]]) -> None:
        if claimed:
            names = [self.prefix + "pclaim", *(self.prefix + m for m, _ in claimed)]
            call_script(self._ack, names, [x for pair in claimed for x in pair])

    def pending(self) -> int:
        try:
            return int(self._redis.zcard(self.prefix + "pdue"))
        except Exception:  # noqa: BLE001 - a gauge
            return -1
