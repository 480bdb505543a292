"""Delivery policies a source applies between dispatch and the sinks: retries and dedupe.

* :class:`RetryPolicy`: an event that failed in a step is dispatched again (alone with the
  other failures of its batch, never with its batch-mates) after an exponential backoff with
  jitter, up to the step's retry count and the policy's maximum age; then it is dead-lettered.
* :class:`RedisDeduper`: effectively-once at the sink: output events whose CloudEvent
  ``source`` + ``id`` were already delivered within the window are not sent again. Marks are
  written after the sink acknowledged (never before, so a crash cannot turn a mark into a
  lost event); a crash between the acknowledgement and the mark can still let one duplicate
  through when the batch is consumed again.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eventbus.eventing._codecs import KafkaRecord
from eventbus.eventing._event import CloudEvent

__all__ = ["RedisDeduper", "RetryPolicy", "dedupe_key"]

log = logging.getLogger(__name__)

#: Steps whose failures are never retried: the input itself or the output cannot be handled.
_FINAL_STEPS = frozenset(("decode", "sink", "dispatch"))


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of events that failed in a step.

    Args:
        retries: retries per failing event (0: dead-letter at once).
        initial_s: first delay.
        max_s: largest delay.
        jitter: fraction of each delay drawn at random (0.2: 80-100 % of the delay), so
            replicas that failed together do not retry together.
        max_age_s: stop retrying once this long has passed since the first failure (None:
            only ``retries`` limits).
        per_step: retry counts that override ``retries`` for some step ids.
    """

    retries: int = 0
    initial_s: float = 0.1
    max_s: float = 5.0
    jitter: float = 0.2
    max_age_s: float | None = None
    per_step: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, spec: Any) -> RetryPolicy:
        """The policy of a pipeline spec (``delivery:`` and the steps' ``retries:``)."""
        d = spec.delivery
        per_step = {s.id: s.retries for s in spec.steps if getattr(s, "retries", None) is not None}
        return cls(d.retries, d.backoff.initial_ms / 1000, d.backoff.max_ms / 1000, d.backoff.jitter, d.max_age_s, per_step)

    @property
    def enabled(self) -> bool:
        return self.retries > 0 or any(v > 0 for v in self.per_step.values())

    def may_retry(self, step: str, attempts: int, age_s: float) -> bool:
        """Whether an event that failed ``attempts`` times in ``step`` gets another try."""
        if step in _FINAL_STEPS:
            return False
        if attempts > self.per_step.get(step, self.retries):
            return False
        return self.max_age_s is None or age_s < self.max_age_s

    def delay(self, attempt: int) -> float:
        """Seconds to wait before try number ``attempt + 1``."""
        base = min(self.initial_s * 2 ** (attempt - 1), self.max_s)
        return base * (1 - self.jitter * random.random())  # noqa: S311 - jitter, not crypto


def dedupe_key(event: CloudEvent | KafkaRecord) -> str | None:
    """``source`` + ``id`` of an output event (read from the headers of an encoded record)."""
    if type(event) is KafkaRecord:
        source = id_ = None
        for name, value in event.headers:
            if name == "ce_id":
                id_ = value.decode(errors="replace")
            elif name == "ce_source":
                source = value.decode(errors="replace")
        if id_ is None or source is None:
            if event.value is None:
                return None
            import orjson

            try:
                obj = orjson.loads(event.value)
                source, id_ = obj.get("source"), obj.get("id")
            except (orjson.JSONDecodeError, AttributeError):
                return None
        return None if id_ is None or source is None else f"{source}\x00{id_}"
    a = event.attributes  # type: ignore[union-attr]
    return f"{a['source']}\x00{a['id']}"


_MARK = """
local px = ARGV[1]
for i = 2, #ARGV do
  redis.call('SET', ARGV[i], '1', 'PX', px)
end
return #ARGV - 1
"""


class RedisDeduper:
    """Remembers delivered output events (``source`` + ``id``) in Redis for ``window_s``.

    Args:
        redis_url: the Redis server.
        pipeline: the pipeline (keys are ``eventbus:dedupe:<pipeline>:<digest>``).
        window_s: how long a delivered event is remembered.
    """

    def __init__(self, redis_url: str, pipeline: str, window_s: float) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(redis_url)
        self._prefix = f"eventbus:dedupe:{pipeline}:"
        self._window_ms = int(window_s * 1000)
        self._mark = self._redis.register_script(_MARK)
        self.errors = 0

    def _key(self, k: str) -> str:
        return self._prefix + hashlib.blake2b(k.encode(), digest_size=12).hexdigest()

    def digests(self, keys: Sequence[str | None]) -> list[str | None]:
        """The Redis keys of ``keys`` (hashed once, before the sink is awaited, so that the
        mark right after its acknowledgement costs one round trip and nothing more)."""
        return [None if k is None else self._key(k) for k in keys]

    async def seen(self, keys: Sequence[str | None], *, hashed: bool = False) -> list[bool]:
        """Which keys were delivered within the window. When Redis does not answer, none
        (fail open: a duplicate is better than a stalled or lost event)."""
        wanted = [k if hashed else self._key(k) for k in keys if k is not None]
        if not wanted:
            return [False] * len(keys)
        try:
            found = await self._redis.mget(wanted)
        except Exception as e:  # noqa: BLE001
            self.errors += 1
            log.warning("dedupe: Redis did not answer (%s); delivering without dedupe", e)
            return [False] * len(keys)
        it = iter(found)
        return [False if k is None else next(it) is not None for k in keys]

    async def mark(self, keys: Sequence[str | None], *, hashed: bool = False) -> None:
        """Remember keys as delivered (after the sink acknowledged them)."""
        wanted = [k if hashed else self._key(k) for k in keys if k is not None]
        if not wanted:
            return
        try:
            # One script call with every key as an argument: packing thousands of separate
            # SET commands costs more Python time than Redis spends on them.
            await self._mark(args=[self._window_ms, *wanted])
        except Exception as e:  # noqa: BLE001
            self.errors += 1
            log.warning("dedupe: marks not written (%s); a redelivery may duplicate", e)

    async def close(self) -> None:
        await self._redis.aclose()
