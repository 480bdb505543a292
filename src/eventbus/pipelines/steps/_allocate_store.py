"""Where an ``allocate`` step's shared state lives: the used budgets (reserved by a Lua script,
so no budget is ever exceeded whichever replica decides), the window of recent requests the
planner re-solves from, and the planner's lock; Redis on the platform, memory in process."""

from __future__ import annotations

import json
from typing import Any

from eventbus._internal import keys
from eventbus.errors import StateUnavailableError
from eventbus.pipelines.steps._allocate_config import duals_key

__all__ = ["AllocateStore"]


_RESERVE = """
local used = KEYS[1]
local k = tonumber(ARGV[1])
local out = {}
local current = {}
for j = 1, k do current[j] = tonumber(redis.call('HGET', used, j) or '0') end
local base = 2 + k
local i = base
while i <= #ARGV do
  local ok = 1
  for j = 1, k do
    if current[j] + tonumber(ARGV[i + j - 1]) > tonumber(ARGV[1 + j]) + 1e-9 then ok = 0 break end
  end
  if ok == 1 then
    for j = 1, k do
      local c = tonumber(ARGV[i + j - 1])
      if c ~= 0 then
        current[j] = current[j] + c
        redis.call('HINCRBYFLOAT', used, j, ARGV[i + j - 1])
      end
    end
  end
  out[#out + 1] = ok
  i = i + k
end
return out
"""


class AllocateStore:
    """The used budgets, request window, request count and plan lock of one allocate step.

    Args:
        step_id: the step id (errors name it).
        pipeline: the pipeline name (Redis keys).
        redis_url: where the state lives; None keeps it in memory (tests, in-process runs).
        num_resources: K, the number of budgets.
    """

    def __init__(
        self, step_id: str, pipeline: str, redis_url: str | None, num_resources: int
    ) -> None:
        self.step_id = step_id
        self.num_resources = num_resources
        self.redis: Any = None
        self._reserve: Any = None
        self._used_key = keys.allocate_used(pipeline, step_id)
        self._window_key = keys.allocate_window(pipeline, step_id)
        self._seen_key = keys.allocate_seen(pipeline, step_id)
        self._lock_key = keys.allocate_plan_lock(pipeline, step_id)
        self._duals_key = duals_key(pipeline, step_id)
        self.memory_window: list[str] = []
        self.memory_seen = 0
        self.used = [0.0] * num_resources  # in-memory mode
        if redis_url:
            from eventbus._internal.redis_client import connect

            self.redis = connect(redis_url, socket_timeout=10)
            self._reserve = self.redis.register_script(_RESERVE)

    def _unavailable(self, e: Exception, what: str = "Redis") -> StateUnavailableError:
        msg = f"allocate step {self.step_id!r}: {what} unavailable ({e}); the batch will be retried"
        return StateUnavailableError(msg)

    def read_duals(self) -> Any:
        """The published duals (a list), or None when none are; Redis mode only."""
        try:
            text = self.redis.get(self._duals_key)
        except Exception as e:  # noqa: BLE001
            raise self._unavailable(e) from None
        return json.loads(text) if text else None

    def record(self, entries: list[str], window: int) -> None:
        """Append encoded requests to the window (keeping the latest ``window``) and count them."""
        if self.redis is None:
            self.memory_window = (self.memory_window + entries)[-window:]
            self.memory_seen += len(entries)
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.rpush(self._window_key, *entries)
            pipe.ltrim(self._window_key, -window, -1)
            pipe.incrby(self._seen_key, len(entries))
            pipe.execute()
        except Exception as e:  # noqa: BLE001
            raise self._unavailable(e) from None

    def reserve(self, consumption: list[list[float]], budget: list[float]) -> list[bool]:
        """For each consumption in order: True when it fits every budget (and is now used)."""
        if not consumption:
            return []
        if self._reserve is None:
            out = []
            for c in consumption:
                ok = all(u + x <= b + 1e-9 for u, x, b in zip(self.used, c, budget))
                if ok:
                    self.used = [u + x for u, x in zip(self.used, c)]
                out.append(ok)
            return out
        args: list[Any] = [self.num_resources, *budget]
        for c in consumption:
            args += c
        try:
            return [bool(x) for x in self._reserve(keys=[self._used_key], args=args)]
        except Exception as e:  # noqa: BLE001
            raise self._unavailable(e, "budget safeguard in Redis") from None

    def adjust(self, deltas: list[float]) -> None:
        """Add ``deltas`` (a correction: actual minus reserved consumption) to the used amounts."""
        if self.redis is None:
            self.used = [u + d for u, d in zip(self.used, deltas)]
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            for k, d in enumerate(deltas):
                if d != 0:
                    pipe.hincrbyfloat(self._used_key, str(k + 1), repr(float(d)))
            pipe.execute()
        except Exception as e:  # noqa: BLE001
            raise self._unavailable(e) from None

    def used_budget(self) -> list[float]:
        """What has been allocated so far, per resource."""
        if self.redis is None:
            return list(self.used)
        raw = self.redis.hgetall(self._used_key)
        return [float(raw.get(str(k + 1).encode(), 0)) for k in range(self.num_resources)]

    def take_plan_lock(self, ttl_s: float) -> bool:
        """True when this replica may re-solve for the next ``ttl_s`` (always, in memory)."""
        if self.redis is None:
            return True
        return bool(self.redis.set(self._lock_key, b"1", nx=True, px=int(ttl_s * 1000)))

    def window(self) -> tuple[list[str], int]:
        """The recorded requests (encoded) and how many were seen in all."""
        if self.redis is None:
            return list(self.memory_window), self.memory_seen
        entries = [x.decode() for x in self.redis.lrange(self._window_key, 0, -1)]
        return entries, int(self.redis.get(self._seen_key) or 0)
