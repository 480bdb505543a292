"""An outer ``join`` (``emit: every`` or ``latest``, ``time: event``) under ``delivery:
{guarantee: exactly_once}``: windows closed by the consumed events, inside their batch's Kafka
transaction, instead of by the step's sweeper.

Under at-least-once the sweeper takes the windows the watermark passed and emits what an outer
join owes for the incomplete ones (one output per combination of the sides present), outside
any consumed batch. No Kafka transaction covers that, so under ``exactly_once`` the sweeper
only dead-letters windows evicted by ``max_pending``, and each batch's one Redis call (the
``ADD`` script of :mod:`._join_pairs`, atomic) stores the batch, moves the watermark and
closes the windows due by it: each is kept as ``x:<t0>:<key>`` with ``__closed`` (for
:data:`REPLAY_S`), its events are indexed in ``cw`` (so that one consumed again finds the
window it was stored in, not a new one), and the closed windows' names are recorded in ``cr``
under the batch's last stored event, the *closer*, which emits their outputs: they go into the
batch's transaction with its offsets. A closer consumed again finds its record and emits the
same outputs, with the same ids. The argument is in docs/concepts/delivery.md, "Outer joins
under exactly once".
"""

from __future__ import annotations

from eventbus.pipelines.steps._aggregate_close import REPLAY_S

__all__ = ["CLOSE", "CLOSE_BYTES", "CLOSE_LIMIT", "LOOKUP", "REPLAY_S", "Closing"]

#: The most windows one batch closes (one Redis script call stays bounded): the others stay
#: due and the next batches close them, each by one closer.
CLOSE_LIMIT = 5000

#: The most bytes of events of the windows one batch closes (at least one window is closed).
CLOSE_BYTES = 64 * 1024 * 1024

#: (windows, bytes, replay ms) per batch: the ``ADD`` script's closing arguments.
Closing = tuple[int, int, int]

#: Lua helpers of the ``ADD`` script under exactly_once: ``ekey(k, f)`` (an event's field in
#: ``cw``/``cr``, length-prefixed: keys and ids may hold any byte) and ``closed_at(k, f)`` (the
#: renamed or closed window an event consumed again was stored in, or false), ``index(x, k)``
#: (index the events of window ``x`` of key ``k`` in ``cw``).
LOOKUP = r"""
local CW, CWX, CR, CRX = prefix .. 'cw', prefix .. 'cwx', prefix .. 'cr', prefix .. 'crx'
local function ekey(k, f) return #k .. ':' .. k .. f end
local function closed_at(k, f)
  if not eos then return false end
  return redis.call('HGET', CW, ekey(k, f))
end
local function index(x, wk)
  local flat = redis.call('HGETALL', prefix .. x)
  for j = 1, #flat, 2 do
    if string.sub(flat[j], 1, 2) ~= '__' then
      local e = ekey(wk, flat[j])
      redis.call('HSET', CW, e, x)
      redis.call('ZADD', CWX, now + replay, e)
    end
  end
end
"""

#: The part of the ``ADD`` script that closes the windows under exactly_once, after the batch
#: was stored, the watermark moved and the evictions marked: ``ks``/``fs`` (each item's key and
#: field), ``closer`` (the index of the batch's last stored item, or nil) and ``recs`` (per
#: item index, its record) are the script's.
CLOSE = r"""
if eos then
  for j = 1, #ks do
    local r = redis.call('HGET', CR, ekey(ks[j], fs[j]))
    if r then recs[j] = r end
  end
  local w = redis.call('HGET', WM, '__w')
  if closer and w then
    local closed, budget = {}, cbytes
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', w, 'LIMIT', 0, climit)) do
      if budget <= 0 then break end
      local h = prefix .. m
      if redis.call('EXISTS', h) == 0 then
        redis.call('ZREM', due, m)
      elseif redis.call('HEXISTS', h, '__evicted') == 0 then
        local got = redis.call('HMGET', h, '__t0', '__b')
        local x, wk = m, nil
        if string.sub(m, 1, 2) == 'w:' then
          wk = string.sub(m, 3)
          -- a name of its own (a key's next window may open at the same time)
          x = 'x:' .. got[1] .. 'c' .. redis.call('HINCRBY', CR, '', 1) .. ':' .. wk
          redis.call('RENAME', h, prefix .. x)
        else
          local c = string.find(m, ':', 3, true)
          wk = string.sub(m, c + 1)
        end
        redis.call('ZREM', due, m)
        budget = budget - (tonumber(got[2]) or 0)
        redis.call('HSET', prefix .. x, '__closed', '1')
        redis.call('PEXPIRE', prefix .. x, replay)
        index(x, wk)
        closed[#closed + 1] = x
      end
    end
    if #closed > 0 then
      local all = {}
      if recs[closer] then all = cjson.decode(recs[closer]) end
      for _, x in ipairs(closed) do all[#all + 1] = x end
      recs[closer] = cjson.encode(all)
      local e = ekey(ks[closer], fs[closer])
      redis.call('HSET', CR, e, recs[closer])
      redis.call('ZADD', CRX, now + replay, e)
    end
  end
  for _, pair in ipairs({{CW, CWX}, {CR, CRX}}) do
    local old = redis.call('ZRANGEBYSCORE', pair[2], '-inf', now, 'LIMIT', 0, 1000)
    if #old > 0 then
      redis.call('HDEL', pair[1], unpack(old))
      redis.call('ZREM', pair[2], unpack(old))
    end
  end
  for j = 1, #out do
    local flat = {}
    if recs[j] then
      for _, x in ipairs(cjson.decode(recs[j])) do
        flat[#flat + 1] = x
        flat[#flat + 1] = redis.call('HGETALL', prefix .. x)
      end
    end
    out[j][5] = flat
  end
end
"""
