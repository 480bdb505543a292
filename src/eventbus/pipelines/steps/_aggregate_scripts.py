"""The Lua text of the aggregate step's three Redis scripts (:class:`~._aggregate_lua.RedisAggregateState`
calls them): ``ADD`` merges a batch's window partials (under exactly_once it also closes the
windows due, :data:`._aggregate_close.CLOSE`), ``CLAIM`` closes the windows due and
takes them for emission, ``ACK`` forgets emitted windows. Each is ``_COMMON`` (the header the
state sends: the aggregations' ops and maxes, the field helpers and the merges of
:mod:`._aggregate_ops`'s partial formats) plus its own body; the key and field layout is in
:mod:`._aggregate_lua`'s docstring."""

from __future__ import annotations

from eventbus.pipelines.steps._aggregate_close import CLOSE

__all__ = ["ACK", "ADD", "CLAIM"]

_COMMON = r"""
local H, DUE, CLAIM, S1, S2 = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local nagg = tonumber(ARGV[1])
local ops, maxes = {}, {}
for a = 1, nagg do ops[a] = ARGV[1 + a]; maxes[a] = tonumber(ARGV[1 + nagg + a]) end
local base = 2 + 2 * nagg
local function I(x) return string.format('%d', x) end
-- each aggregation's field suffix, made once (not a number turned into text per item)
local SFX = {}
for a = 1, nagg do SFX[a] = '\0' .. a end
local function F(wid, a) return wid .. SFX[a] end
-- a count aggregation's field is the window's event count, as complete as 'c' in every
-- layout: the window's count is read from it when there is one (see the lean layout below)
local CNT = nil
for a = nagg, 1, -1 do if ops[a] == 'count' then CNT = a end end
local CF = CNT and SFX[CNT] or '\0c'
local function hget(f) return redis.call('HGET', H, f) end
local function cut(p, sep)
  local at = string.find(p, sep, 1, true)
  if not at then return p, nil end
  return string.sub(p, 1, at - 1), string.sub(p, at + 1)
end
-- a number added to a field: an integer with HINCRBY (exact, and a third of HINCRBYFLOAT's
-- cost) while the field holds one; otherwise (a fraction, a field holding one, an int64
-- overflow) HINCRBYFLOAT
local function addnum(f, p)
  if string.find(p, '^-?%d+$') then
    local r = redis.pcall('HINCRBY', H, f, p)
    if type(r) == 'number' then return end
  end
  redis.call('HINCRBYFLOAT', H, f, p)
end
local function addp(wid, a, p)
  local op, fa = ops[a], F(wid, a)
  -- a count keeps its own field, equal to the window's c: replicas of the previous script
  -- version (a canary beside this one) read it
  if op == 'count' then redis.call('HINCRBY', H, fa, p)
  elseif op == 'sum' then addnum(fa, p)
  elseif op == 'avg' then
    local s, n = cut(p, ' ')
    addnum(fa, s)
    redis.call('HINCRBY', H, fa .. 'n', n)
  elseif op == 'min' or op == 'max' then
    if p ~= '' then
      local cur = hget(fa)
      if not cur or (op == 'min' and tonumber(p) < tonumber(cur))
          or (op == 'max' and tonumber(p) > tonumber(cur)) then
        redis.call('HSET', H, fa, p)
      end
    end
  elseif op == 'first' or op == 'last' then
    if p ~= '' then
      local t, v = cut(p, ' ')
      local cur = hget(fa .. 't')
      if not cur or (op == 'first' and tonumber(t) < tonumber(cur))
          or (op == 'last' and tonumber(t) >= tonumber(cur)) then
        redis.call('HSET', H, fa .. 't', t, fa, v)
      end
    end
  elseif op == 'distinct' then
    if p ~= '' then
      local cur = hget(fa)
      if cur then redis.call('SET', S1, cur) else redis.call('DEL', S1) end
      local vals = {}
      for v in string.gmatch(p, '[^\n]+') do
        vals[#vals + 1] = v
        if #vals == 500 then redis.call('PFADD', S1, unpack(vals)); vals = {} end
      end
      if #vals > 0 then redis.call('PFADD', S1, unpack(vals)) end
      redis.call('HSET', H, fa, redis.call('GET', S1))
    end
  else -- collect, reducer: "<total>\n<item>\n<item>..."
    local total, rest = cut(p, '\n')
    local room = maxes[a] - tonumber(hget(fa .. 'n') or '0')
    local taken = {}
    if rest and room > 0 then
      for v in string.gmatch(rest, '[^\n]+') do
        taken[#taken + 1] = v
        if #taken >= room then break end
      end
    end
    if #taken > 0 then
      local cur, add = hget(fa), table.concat(taken, '\n')
      redis.call('HSET', H, fa, cur and (cur .. '\n' .. add) or add)
      redis.call('HINCRBY', H, fa .. 'n', #taken)
    end
    if tonumber(total) > #taken then redis.call('HINCRBY', H, fa .. 'x', I(tonumber(total) - #taken)) end
  end
end
local function partial(wid, a)
  local op, fa = ops[a], F(wid, a)
  if op == 'count' or op == 'sum' then return hget(fa) or '0'
  elseif op == 'avg' then return (hget(fa) or '0') .. ' ' .. (hget(fa .. 'n') or '0')
  elseif op == 'first' or op == 'last' then
    local t = hget(fa .. 't')
    if t then return t .. ' ' .. hget(fa) end
    return ''
  elseif op == 'min' or op == 'max' then return hget(fa) or ''
  end
  local items = hget(fa)
  local total = I(tonumber(hget(fa .. 'n') or '0') + tonumber(hget(fa .. 'x') or '0'))
  if items then return total .. '\n' .. items end
  return total
end
local function drop(wid)
  local fields = {wid .. '\0c', wid .. '\0e'}
  for a = 1, nagg do
    local fa = F(wid, a)
    fields[#fields + 1] = fa; fields[#fields + 1] = fa .. 'n'
    fields[#fields + 1] = fa .. 't'; fields[#fields + 1] = fa .. 'x'
  end
  redis.call('HDEL', H, unpack(fields))
  redis.call('ZREM', DUE, wid)
  redis.call('ZREM', CLAIM, wid)
end
local function mergew(src, dst)
  for a = 1, nagg do
    if ops[a] == 'distinct' then
      local s = hget(F(src, a))
      if s then
        local d = hget(F(dst, a))
        redis.call('SET', S1, s)
        if d then redis.call('SET', S2, d); redis.call('PFMERGE', S1, S1, S2) end
        redis.call('HSET', H, F(dst, a), redis.call('GET', S1))
      end
    else addp(dst, a, partial(src, a)) end
  end
  redis.call('HINCRBY', H, dst .. '\0c', hget(src .. '\0c') or '0')
  local e = tonumber(hget(src .. '\0e') or '0')
  if e > tonumber(hget(dst .. '\0e') or '0') then redis.call('HSET', H, dst .. '\0e', I(e)) end
  drop(src)
end
-- a window's values, one string: its id, count, end, then per aggregation its value, each
-- NUL-terminated (no value holds a NUL: JSON texts, numbers and keys without one), so a
-- client parses a split rather than a reply of many parts; its fields read with one HMGET
local function values(wid)
  local fs = {wid .. CF, wid .. '\0e'}
  for a = 1, nagg do
    local op, fa = ops[a], F(wid, a)
    if op == 'avg' then fs[#fs + 1] = fa; fs[#fs + 1] = fa .. 'n'
    elseif op == 'collect' or op == 'reducer' then fs[#fs + 1] = fa .. 'x'; fs[#fs + 1] = fa
    else fs[#fs + 1] = fa end
  end
  local g = redis.call('HMGET', H, unpack(fs))
  local out, j = {wid, g[1] or '0', g[2] or '0'}, 3
  for a = 1, nagg do
    local op, v = ops[a], g[j] or ''
    if op == 'avg' then v = (g[j] or '0') .. ' ' .. (g[j + 1] or '0'); j = j + 2
    elseif op == 'collect' or op == 'reducer' then v = (g[j] or '0') .. '\n' .. (g[j + 1] or ''); j = j + 2
    elseif op == 'distinct' then
      v = '0'
      if g[j] then redis.call('SET', S1, g[j]); v = I(redis.call('PFCOUNT', S1)) end
      j = j + 1
    else j = j + 1 end
    out[#out + 1] = v
  end
  out[#out + 1] = ''
  return table.concat(out, '\0')
end
-- a command over many arguments, in chunks (a Lua call takes a bounded number of them)
local function each(cmd, key, list, step)
  for c = 1, #list, step do
    redis.call(cmd, key, unpack(list, c, math.min(#list, c + step - 1)))
  end
end
-- drop many windows: their fields, due and claim entries, with a few calls for all of them
local function dropall(wids)
  local fields = {}
  for _, wid in ipairs(wids) do
    fields[#fields + 1] = wid .. '\0c'; fields[#fields + 1] = wid .. '\0e'
    for a = 1, nagg do
      local fa = F(wid, a)
      fields[#fields + 1] = fa; fields[#fields + 1] = fa .. 'n'
      fields[#fields + 1] = fa .. 't'; fields[#fields + 1] = fa .. 'x'
    end
  end
  each('HDEL', H, fields, 1000)
  each('ZREM', DUE, wids, 1000)
  each('ZREM', CLAIM, wids, 1000)
end
"""

ADD = (
    _COMMON
    + r"""
local now, late_ms, gap = tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
local update = ARGV[base + 3] == '1'
-- the lean layout: tumbling or hopping windows with a count aggregation, no emit: update (whose
-- ids the previous version made of 'c'). The count's field is the window's count, 'c' is not
-- written: a third of an item's writes. The previous script version (a canary beside this
-- one) still gets such windows right: it reads the count from the count's field; it writes
-- 'c' itself and, finding it new, writes the window's end and due entry again (the same
-- values: a tumbling or hopping window's end never moves).
local lean = gap == 0 and not update and CNT ~= nil
local ttl, ndig, SEEN = tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5]), KEYS[6]
-- the batch's event digests, DW characters each, in one argument (one argument per digest
-- cost the client more to pack than the rest of the batch's call)
local D, DW = ARGV[base + 6], 24
-- exactly_once (see _aggregate_close's docstring): the batch closes the windows its
-- watermark made due, for its last applied event to emit; CLOSED orders those records
-- ('X\0<digest>': the windows' values) by when they are forgotten
local EOS, CLOSED = ARGV[base + 8] == '1', KEYS[7]
local function dig(p) return string.sub(D, (p - 1) * DW + 1, p * DW) end
-- delivery.dedupe: an event applied before (a batch replayed after a crash) makes the whole
-- call a no-op that names it; the caller folds the batch again without it and calls again.
-- each digest cut out of D once (the same strings are looked up, then added)
local DG = {}
for p = 1, ndig do DG[p] = dig(p) end
if ndig > 0 then
  local dups = {}
  for c = 0, ndig - 1, 1000 do
    local scores = redis.call('ZMSCORE', SEEN, unpack(DG, c + 1, math.min(ndig, c + 1000)))
    for j = 1, #scores do if scores[j] then dups[#dups + 1] = c + j end end
  end
  if #dups > 0 then
    -- exactly_once: the windows an event consumed before closed, to emit again (its batch's
    -- transaction may have aborted; a committed one is never consumed again)
    local closed, closers = {}, {}
    if EOS then
      for _, p in ipairs(dups) do
        local x = hget('X\0' .. DG[p])
        if x then closed[#closed + 1] = x; closers[#closers + 1] = p end
      end
    end
    return {'', {}, dups, closed, closers}
  end
end
local applied = {}
local wm, wmc = hget('wm'), tonumber(hget('wmc') or '0')
if wm then wm = tonumber(wm) end
-- lateness is judged by the watermark the timer reached (the events' one, or the clock's
-- once the input was idle): W; 'wm' itself stays the latest event time merged
local W = wm
if wmc > 0 and (not W or wmc > W) then W = wmc end
local lates, ups, maxt = {}, {}, nil
-- the items come as one argument, a JSON array of their fields (one argument per field cost
-- the client more to pack than the script takes to run; cjson decodes it in C, a quarter of
-- what splitting a string in Lua took): key, start (text: the window id is made of it),
-- end, latest time, count, applied events (text), partials
local A = cjson.decode(ARGV[base + 7])
local i, nA, nl = 1, #A, 0
while i <= nA do
  local key, fin, mt = A[i], A[i + 2], A[i + 3]
  local wid = nil
  if gap > 0 then
    local start = tonumber(A[i + 1])
    local idx = 'S\0' .. key
    local list, keep, hit, s0 = hget(idx), {}, {}, start
    if list then
      for s in string.gmatch(list, '%S+') do
        local w = s .. ':' .. key
        local e = tonumber(hget(w .. '\0e') or '0')
        if tonumber(s) < fin and start < e then
          hit[#hit + 1] = w
          if tonumber(s) < s0 then s0 = tonumber(s) end
        else keep[#keep + 1] = s end
      end
    end
    if #hit > 0 or not W or fin + late_ms > W then
      wid = I(s0) .. ':' .. key
      for _, w in ipairs(hit) do if w ~= wid then mergew(w, wid) end end
      keep[#keep + 1] = I(s0)
      redis.call('HSET', H, idx, table.concat(keep, ' '))
    end
  elseif not W or fin + late_ms > W then
    wid = A[i + 1] .. ':' .. key
  end
  if wid then
    local n, c = A[i + 4], nil
    for a = 1, nagg do
      if lean and a == CNT then c = redis.call('HINCRBY', H, wid .. CF, n)
      else addp(wid, a, A[i + 5 + a]) end
    end
    if not lean then c = redis.call('HINCRBY', H, wid .. '\0c', n) end
    if gap > 0 then
      local e = tonumber(hget(wid .. '\0e') or '0')
      if fin > e then e = fin; redis.call('HSET', H, wid .. '\0e', I(e)) end
      redis.call('ZADD', DUE, I(e + late_ms), wid)
    elseif c == n then
      -- a new tumbling or hopping window (its end never moves): its end and due entry, once
      redis.call('HSET', H, wid .. '\0e', I(fin))
      redis.call('ZADD', DUE, I(fin + late_ms), wid)
    end
    if not maxt or mt > maxt then maxt = mt end
    nl = nl + 1; lates[nl] = '0'
    if update then ups[#ups + 1] = values(wid) end
  else
    nl = nl + 1; lates[nl] = '1'
  end
  i = i + 6 + nagg
end
if maxt and (not wm or maxt > wm) then redis.call('HSET', H, 'wm', I(maxt), 'wmw', I(now)) end
if ndig > 0 then -- remember the applied events (not the late ones: a replay dead-letters them again)
  local forget, z, nz, some_late = I(now + ttl), {}, 0, false
  for k = 1, nl do if lates[k] == '1' then some_late = true; break end end
  local function remember(p)
    z[nz + 1] = forget; z[nz + 2] = DG[p]; nz = nz + 2
    if nz >= 1000 then redis.call('ZADD', SEEN, unpack(z, 1, nz)); nz = 0 end
  end
  if some_late then -- the events of the merged items (a hopping event may be in both kinds)
    local k, j = 1, 1
    while j <= nA do
      if lates[k] == '0' then
        for p in string.gmatch(A[j + 5], '%d+') do applied[tonumber(p)] = true end
      end
      k = k + 1
      j = j + 6 + nagg
    end
    for p in pairs(applied) do remember(p) end
  else -- every event of the batch
    for p = 1, ndig do remember(p) end
  end
  if nz > 0 then redis.call('ZADD', SEEN, unpack(z, 1, nz)) end
  redis.call('ZREMRANGEBYSCORE', SEEN, '-inf', I(now))
end
"""
    + CLOSE
    + r"""-- per item '0' (merged) or '1' (late), one string; window values only with emit: update;
-- exactly_once: the windows closed (a JSON array of their values) and the closer's position
return {table.concat(lates), ups, {}, closed, closers}
"""
)

CLAIM = (
    _COMMON
    + r"""
local now, lease, limit = tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
local processing, session = ARGV[base + 3] == '1', ARGV[base + 4] == '1'
local idle = tonumber(ARGV[base + 5])
local wm, wmc, eff = hget('wm'), hget('wmc'), nil
if processing then eff = now
elseif wm then
  -- the clock moves the watermark only once no event moved it for idle_timeout_s: a backlog
  -- read slower than real time must not close windows its next events still belong to
  local quiet = now - tonumber(hget('wmw') or now) - idle
  eff = tonumber(wm)
  if quiet > 0 then eff = eff + quiet end
end
if eff and wmc and tonumber(wmc) > eff then eff = tonumber(wmc) end
if eff and (not wmc or eff > tonumber(wmc)) then redis.call('HSET', H, 'wmc', I(eff)) end
local out, wids, claims, lease_end = {}, {}, {}, I(now + lease)
local lists = {redis.call('ZRANGEBYSCORE', CLAIM, '-inf', I(now), 'LIMIT', 0, limit)}
if eff then lists[2] = redis.call('ZRANGEBYSCORE', DUE, '-inf', I(eff), 'LIMIT', 0, limit) end
for _, list in ipairs(lists) do
  for _, wid in ipairs(list) do
    wids[#wids + 1] = wid
    claims[#claims + 1] = lease_end; claims[#claims + 1] = wid
    if session then
      local s, key = cut(wid, ':')
      local idx, keep = 'S\0' .. key, {}
      for x in string.gmatch(hget(idx) or '', '%S+') do if x ~= s then keep[#keep + 1] = x end end
      if #keep > 0 then redis.call('HSET', H, idx, table.concat(keep, ' ')) else redis.call('HDEL', H, idx) end
    end
    out[#out + 1] = values(wid)
  end
end
-- taken off the due set and leased, a few calls for all the windows
each('ZREM', DUE, wids, 1000)
each('ZADD', CLAIM, claims, 1000)
return out
"""
)

ACK = (
    _COMMON
    + r"""
local wids = {}
for i = base, #ARGV do wids[#wids + 1] = ARGV[i] end
dropall(wids)
return #wids
"""
)
