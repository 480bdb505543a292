"""An ``aggregate`` step under ``delivery: {guarantee: exactly_once}``: windows closed by the
consumed events, inside their batch's Kafka transaction, instead of by the step's timer.

Under at-least-once a timer closes windows (due by the watermark, which the wall clock also
moves) and emits them outside any consumed batch. No Kafka transaction covers such an
emission, so under ``exactly_once`` the timer does not run. Instead each batch's one Redis
call (the ``ADD`` script, atomic) merges the batch, moves the watermark, and closes the
windows due by it, recording them (their values) under the digest of the batch's last applied
event, the *closer*; the step emits them as that event's outputs, so they go into the batch's
transaction with its offsets. Each applied event is remembered (``seen``); an event consumed
again (its transaction aborted, or a fenced zombie's) is not merged twice, and when it was a
closer its record gives the same windows, values and ids again, to emit in the new attempt's
transaction. The records and the applied events are kept :data:`REPLAY_S`, far beyond the
time a transaction may stay open (the broker aborts it after 60 s). The argument is in
docs/concepts/delivery.md, "Aggregates under exactly once".
"""

from __future__ import annotations

from eventbus.pipelines.steps._aggregate_config import AggregateConfig

__all__ = ["CLOSE", "CLOSE_LIMIT", "REPLAY_S", "exactly_once_refusal"]

#: How long (seconds) an aggregate under exactly_once remembers each applied event and the
#: windows each closer closed: an event consumed again later than this is merged again.
REPLAY_S = 600.0

#: The most windows one batch closes (one Redis script call stays bounded): the others stay
#: due and the next batches close them, each by one closer.
CLOSE_LIMIT = 5000


#: The part of the ``ADD`` script (:mod:`._aggregate_scripts`) that closes the windows under
#: exactly_once, after the batch was merged and its events remembered: ``EOS``, ``CLOSED``,
#: ``applied``, ``lates``, ``DG`` and the helpers are the script's.
CLOSE = r"""
local closed, closers = {}, {}
if EOS and ndig > 0 then
  -- the closer: the batch's last applied event (remembered in SEEN above)
  local closer = nil
  if next(applied) == nil then
    local any = false
    for k = 1, nl do if lates[k] == '0' then any = true; break end end
    if any then closer = ndig end
  else
    for p in pairs(applied) do if not closer or p > closer then closer = p end end
  end
  local eff = hget('wm')
  if eff then eff = tonumber(eff) end
  local wmc = tonumber(hget('wmc') or '0')
  if eff and wmc > eff then eff = wmc end
  if closer and eff then
    -- at most ARGV[base + 9] a call (a bounded script): the rest stay due, closed by the
    -- next batches (each window by one closer)
    local wids, vals = redis.call('ZRANGEBYSCORE', DUE, '-inf', I(eff), 'LIMIT', 0, tonumber(ARGV[base + 9])), {}
    for _, wid in ipairs(wids) do
      if gap > 0 then -- a session: off its key's open session starts
        local s, key = cut(wid, ':')
        local idx, keep = 'S\0' .. key, {}
        for x in string.gmatch(hget(idx) or '', '%S+') do if x ~= s then keep[#keep + 1] = x end end
        if #keep > 0 then redis.call('HSET', H, idx, table.concat(keep, ' ')) else redis.call('HDEL', H, idx) end
      end
      vals[#vals + 1] = values(wid)
    end
    if #wids > 0 then
      dropall(wids)
      local x = cjson.encode(vals)
      redis.call('HSET', H, 'X\0' .. DG[closer], x)
      redis.call('ZADD', CLOSED, I(now + ttl), 'X\0' .. DG[closer])
      closed[1] = x; closers[1] = closer
    end
  end
  local old = redis.call('ZRANGEBYSCORE', CLOSED, '-inf', I(now), 'LIMIT', 0, 1000)
  if #old > 0 then
    redis.call('HDEL', H, unpack(old))
    redis.call('ZREM', CLOSED, unpack(old))
  end
end
"""


def exactly_once_refusal(config: AggregateConfig) -> tuple[str, str] | None:
    """Why an aggregate with ``config`` cannot run under ``exactly_once``: (the setting, the
    reason and its fix), or None when it can."""
    if config.time == "processing":
        return (
            "time 'processing'",
            "processing-time windows close by the wall clock, from a timer outside any consumed "
            "batch, so no Kafka transaction covers their outputs; use time: event (windows then "
            "close when a consumed event moves the watermark past them, inside its batch's "
            "transaction)",
        )
    if "idle_timeout_s" in config.model_fields_set:
        return (
            f"idle_timeout_s {config.idle_timeout_s:g}",
            "the wall clock closes the windows of an idle input from a timer outside any "
            "consumed batch, so no Kafka transaction covers their outputs; drop "
            "idle_timeout_s (under exactly_once a window closes when a consumed event moves "
            "the watermark past it: an input that stops leaves its last windows open until "
            "the next event)",
        )
    if config.emit == "update":
        return (
            "emit 'update'",
            "an intermediate result is emitted by the event that changed the window, and an "
            "event consumed again after an aborted transaction is not merged again, so its "
            "update would not be emitted again; use emit: close",
        )
    return None
