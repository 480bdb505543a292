"""Consumption feedback of an ``allocate`` step (``pacing.feedback``): the ledger of decisions
awaiting feedback, and the correction each settled decision makes to the used budgets.

A decision reserves its estimated consumption (the safeguard adds it to the used amounts). Its
feedback event, arriving later on any of the pipeline's sources, names the decision (the request
event's id) and its outcome; the step then adds ``actual - estimate`` to the used amounts, so
``budget - used`` is the budget minus what was really consumed minus the estimates of the
decisions still in flight. A decision with no feedback within ``timeout_s`` settles at
``missing_outcome``. The ledger is in Redis on the platform (a hash of pending decisions and a
sorted set of their times: whichever replica gets the feedback settles it, once) and in memory
in process.
"""

from __future__ import annotations

import json
import math
from typing import Any

from eventbus._internal import keys
from eventbus.errors import StateUnavailableError

__all__ = ["DecisionLedger", "settle_outcome"]


class DecisionLedger:
    """Decisions awaiting feedback: id -> (decided at, encoded record).

    Args:
        step_id: the step id (errors name it).
        pipeline: the pipeline name (Redis keys).
        redis: a Redis client, or None for memory.
    """

    def __init__(self, step_id: str, pipeline: str, redis: Any) -> None:
        self.step_id = step_id
        self.redis = redis
        self._pending_key = keys.allocate_pending(pipeline, step_id)
        self._times_key = keys.allocate_pending_times(pipeline, step_id)
        self.memory: dict[str, tuple[float, str]] = {}

    def _unavailable(self, e: Exception) -> StateUnavailableError:
        msg = f"allocate step {self.step_id!r}: decision ledger in Redis unavailable ({e}); the batch will be retried"
        return StateUnavailableError(msg)

    def add(self, records: list[tuple[str, str]], now: float) -> None:
        """Record decisions (id, encoded record) made at ``now``."""
        if not records:
            return
        if self.redis is None:
            for decision, record in records:
                self.memory.pop(decision, None)  # to the end: the dict stays in time order
                self.memory[decision] = (now, record)
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(self._pending_key, mapping=dict(records))
            pipe.zadd(self._times_key, {decision: now for decision, _ in records})
            pipe.execute()
        except Exception as e:  # noqa: BLE001
            raise self._unavailable(e) from None

    def take(self, decisions: list[str]) -> list[str | None]:
        """Remove and return each decision's record; None for one unknown or already settled
        (only one caller gets a record, whichever replica asks)."""
        if self.redis is None:
            return [
                rec[1] if (rec := self.memory.pop(d, None)) is not None else None for d in decisions
            ]
        out: list[str | None] = []
        try:
            for d in decisions:
                pipe = self.redis.pipeline(transaction=False)
                pipe.hget(self._pending_key, d)
                pipe.hdel(self._pending_key, d)
                pipe.zrem(self._times_key, d)
                raw, deleted, _ = pipe.execute()
                out.append(raw.decode() if raw is not None and deleted else None)
        except Exception as e:  # noqa: BLE001
            raise self._unavailable(e) from None
        return out

    def expired(self, before: float, limit: int = 10_000) -> list[str]:
        """Remove and return the records of decisions made before ``before`` (at most ``limit``)."""
        if self.redis is None:
            # in insertion order, which is the clock's: stop at the first one not yet due (a
            # scan of every pending decision per batch was 10% of the paced step's time)
            old: list[str] = []
            for d, (t, _) in self.memory.items():
                if t >= before or len(old) >= limit:
                    break
                old.append(d)
            return [self.memory.pop(d)[1] for d in old]
        try:
            ids = [
                x.decode()
                for x in self.redis.zrangebyscore(
                    self._times_key, "-inf", f"({before}", start=0, num=limit
                )
            ]
        except Exception as e:  # noqa: BLE001
            raise self._unavailable(e) from None
        return [r for r in self.take(ids) if r is not None]

    def records(self) -> list[str]:
        """Every pending decision's record (a scan of the ledger)."""
        if self.redis is None:
            return [r for _, r in self.memory.values()]
        try:
            return [v.decode() for _, v in self.redis.hscan_iter(self._pending_key, count=1000)]
        except Exception as e:  # noqa: BLE001
            raise self._unavailable(e) from None

    def pending(self) -> int:
        """Decisions awaiting feedback."""
        if self.redis is None:
            return len(self.memory)
        return int(self.redis.hlen(self._pending_key))


def settle_outcome(value: object) -> float:
    """A feedback outcome as a float; ValueError naming it when not a finite number >= 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        msg = f"feedback outcome must be a finite number >= 0; got {value!r:.80}"
        raise ValueError(msg)
    return float(value)


def encode(segment: int, item: int, weights: dict[str, float], predicted: float) -> str:
    """A decision's record: its segment, item, the weights it reserved at and the raw
    (uncalibrated) predicted rate of the feedback's weight."""
    return json.dumps([segment, item, weights, predicted])
