"""The event-time watermark of a ``join`` step (``time: event``), one per source partition.

Each source partition (a *lane*: ``<topic>[<partition>]`` for Kafka, ``-`` for events that
came without one, e.g. over HTTP) keeps the latest event time the step merged from it and the
wall-clock time of that event. The step's watermark is the smallest latest event time over
the lanes that sent an event within ``watermark_idle_s`` (a slow partition holds it back, a
fast one does not make the slow one's events late); when every lane is idle it is the largest
latest event time moved on by the wall-clock time since (so the last windows close). It never
goes back.

An event is late when its time plus ``window_s`` plus ``allowed_lateness_s`` is before the
watermark of the batches before it; a window closes (the sweeper takes it) once the watermark
passes its first event's time plus ``window_s`` plus ``allowed_lateness_s``.

In Redis the lanes are a hash ``wm`` under the step's prefix (``<lane>`` -> ``<event ms>,<wall
ms>``, ``__w`` -> the watermark), read and written inside the step's scripts (:data:`LUA`), so
a batch's lateness, its windows and the watermark move together atomically.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["LUA", "NO_LANE", "PROCESSING", "Clock", "Watermark"]

#: The lane of events that came without a source partition (HTTP, gRPC, in-process runs).
NO_LANE = "-"

#: Lua functions the join scripts include: ``wm_read(WM, now, idle)`` -> the watermark or
#: nil; ``wm_advance(WM, seen, now, idle)`` merges ``seen`` (lane -> latest event ms of the
#: batch) and returns the new watermark.
LUA = """
local function wm_read(WM, now, idle)
  local flat = redis.call('HGETALL', WM)
  local stored, lo, hi = nil, nil, nil
  for j = 1, #flat, 2 do
    local f, v = flat[j], flat[j + 1]
    if f == '__w' then
      stored = tonumber(v)
    else
      local c = string.find(v, ',', 1, true)
      local t, wall = tonumber(string.sub(v, 1, c - 1)), tonumber(string.sub(v, c + 1))
      if now - wall < idle then
        if not lo or t < lo then lo = t end
      else
        local x = t + now - wall
        if not hi or x > hi then hi = x end
      end
    end
  end
  local w = lo or hi
  if stored and (not w or stored > w) then w = stored end
  return w
end
local function wm_advance(WM, seen, now, idle)
  for lane, t in pairs(seen) do
    local v = redis.call('HGET', WM, lane)
    if v then
      local cur = tonumber(string.sub(v, 1, string.find(v, ',', 1, true) - 1))
      if cur > t then t = cur end
    end
    redis.call('HSET', WM, lane, string.format('%d,%d', t, now))
  end
  local w = wm_read(WM, now, idle)
  if w then redis.call('HSET', WM, '__w', string.format('%d', w)) end
  return w
end
"""


class Watermark:
    """The same watermark in process memory (the in-memory join states).

    Args:
        idle_ms: how long a lane may send nothing before it stops holding the watermark back.
    """

    def __init__(self, idle_ms: int) -> None:
        self.idle_ms = idle_ms
        self.lanes: dict[str, tuple[int, int]] = {}  # lane -> (latest event ms, wall ms)
        self.stored: int | None = None

    def read(self, now_ms: int) -> int | None:
        """The watermark at wall-clock ``now_ms`` (None before any event)."""
        active = [t for t, wall in self.lanes.values() if now_ms - wall < self.idle_ms]
        idle = [
            t + now_ms - wall for t, wall in self.lanes.values() if now_ms - wall >= self.idle_ms
        ]
        w = min(active) if active else (max(idle) if idle else None)
        if self.stored is not None and (w is None or self.stored > w):
            w = self.stored
        return w

    def advance(self, seen: Iterable[tuple[str, int]], now_ms: int) -> int | None:
        """Merge (lane, event ms) of a batch; the new watermark."""
        for lane, t in seen:
            cur = self.lanes.get(lane)
            self.lanes[lane] = (max(t, cur[0]) if cur else t, now_ms)
        self.stored = self.read(now_ms)
        return self.stored


@dataclass(frozen=True)
class Clock:
    """How a join step's state tells time.

    Attributes:
        event: windows and lateness by event time (the watermark); else the wall clock.
        lateness_ms: ``allowed_lateness_s`` in ms (event time only).
        idle_ms: ``watermark_idle_s`` in ms.
    """

    event: bool = False
    lateness_ms: int = 0
    idle_ms: int = 30_000

    def args(self) -> list[int]:
        """The scripts' ARGV of this clock."""
        return [int(self.event), self.lateness_ms, self.idle_ms]


#: The wall clock (``time: processing``).
PROCESSING = Clock()
