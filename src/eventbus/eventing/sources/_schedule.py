"""The schedule source at run time: ticks written once to the pipeline's ingress topic.

Every replica of the pipeline runs a :class:`ScheduleRunner` per schedule; they agree through
one Redis hash per schedule (:func:`eventbus._internal.keys.schedule`):

* ``owner``/``until``: a lease. A pass first claims it (or renews it); only the holder emits.
  A replica that stops gives it back; one that dies loses it after ``LEASE_S``, and another
  replica takes over.
* ``through``: epoch ms; every tick at or before it was emitted (or skipped as missed). It is
  set to the current time when the schedule first runs: ticks before that never fire.
* ``emitted``/``missed``: counters over the schedule's life (``missed``: skipped by the
  ``catch_up`` policy, each also logged).

A pass of the holder: the ticks in ``(through, now]`` (at most ``_CAP``), the policy applied to
those older than ``misfire_grace_s``, the rest written to the ingress topic (acknowledged by
the broker), then ``through`` advanced by a compare-and-set that holds only while the lease
does. A tick's event has a deterministic ``id`` (its time) and ``source``: a holder that dies
between the broker's acknowledgement and the advance (a few milliseconds), or that stalls past
its lease while sending, lets the next holder write the same event again, and the pipeline's
``delivery.dedupe`` removes that copy. Nothing else emits a tick twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

from eventbus._internal import keys
from eventbus.eventing._cron import Cron
from eventbus.eventing._event import CloudEvent
from eventbus.eventing.sources._schedule_config import ScheduleSourceConfig

__all__ = ["LEASE_S", "ScheduleRunner", "due_ticks", "tick_event"]

log = logging.getLogger(__name__)

#: How long a holder's lease lasts without renewal; holders renew every third of it.
LEASE_S = 6.0
#: State not touched for this long (no replica ran the schedule) expires: it starts afresh.
STATE_TTL_S = 30 * 86400
#: Most ticks one pass looks at (a long outage is worked through in several passes).
_CAP = 20_000

# KEYS[1]: the schedule's hash. ARGV: owner, now ms, lease ms, ttl ms.
# Returns {1, through} to the holder, {0, owner} otherwise.
_CLAIM = """
local owner = redis.call('HGET', KEYS[1], 'owner')
local untl = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
if owner and owner ~= ARGV[1] and untl > tonumber(ARGV[2]) then
  return {0, owner}
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'until', tonumber(ARGV[2]) + tonumber(ARGV[3]))
local through = redis.call('HGET', KEYS[1], 'through')
if not through then
  through = ARGV[2]
  redis.call('HSET', KEYS[1], 'through', through)
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1, through}
"""

# KEYS[1]: the schedule's hash. ARGV: owner, expected through, new through, emitted, missed.
_ADVANCE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'through') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'through', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'emitted', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'missed', ARGV[5])
return 1
"""

# KEYS[1]: the schedule's hash. ARGV: owner.
_RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'until', 0)
  return 1
end
return 0
"""


@dataclass
class Due:
    """What one pass does: ``emit`` (tick times, ms) and how many it skips as missed;
    ``through``: where the pass ends; ``more``: the pass stopped at its cap before now."""

    emit: list[int] = field(default_factory=list)
    late: int = 0
    missed: int = 0
    through: int = 0
    more: bool = False


def _ticks(
    config: ScheduleSourceConfig, cron: Cron | None, after_ms: int, until_ms: int
) -> list[int]:
    """Tick times in ``(after_ms, until_ms]``, at most ``_CAP``."""
    if config.every_s is not None:
        every = round(config.every_s * 1000)
        first = (after_ms // every + 1) * every
        return list(range(first, until_ms + 1, every)[:_CAP])
    assert cron is not None
    out: list[int] = []
    for at in cron.fire_times(after_ms / 1000, ZoneInfo(config.timezone)):
        ms = round(at * 1000)
        if ms > until_ms or len(out) == _CAP:
            break
        out.append(ms)
    return out


def due_ticks(
    config: ScheduleSourceConfig, through_ms: int, now_ms: int, cron: Cron | None = None
) -> Due:
    """The ticks a pass at ``now_ms`` emits and skips, ``through_ms`` being done.

    Ticks older than ``misfire_grace_s`` are missed: ``catch_up`` decides which of them fire.
    """
    if config.cron is not None and cron is None:
        cron = Cron.parse(config.cron)
    ticks = _ticks(config, cron, through_ms, now_ms)
    if not ticks:
        return Due(through=through_ms)
    boundary = now_ms - round(config.misfire_grace_s * 1000)
    missed = [t for t in ticks if t < boundary]
    on_time = ticks[len(missed) :]
    more = len(ticks) == _CAP and ticks[-1] < now_ms
    if more and not on_time:
        keep: list[int] = []  # newer missed ticks follow in the next pass
    elif config.catch_up == "latest":
        keep = missed[-1:]
    elif config.catch_up == "all":
        keep = missed[-config.max_catch_up :]
    else:
        keep = []
    return Due(
        emit=keep + on_time,
        late=len(keep),
        missed=len(missed) - len(keep),
        through=ticks[-1],
        more=more,
    )


def tick_event(config: ScheduleSourceConfig, pipeline: str, tick_ms: int) -> CloudEvent:
    """The event of one tick: ``time`` and ``id`` are the tick time (RFC 3339, UTC)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(tick_ms // 1000))
    stamp += f".{tick_ms % 1000:03d}Z" if tick_ms % 1000 else "Z"
    return CloudEvent.create(
        type=config.type,
        source=config.event_source(pipeline),
        id=stamp,
        time=stamp,
        data=config.data,
    )


class ScheduleRunner:
    """Emits one schedule's ticks while this process holds its lease (see the module doc).

    Args:
        config: the schedule.
        pipeline: the pipeline name (state key, default event source).
        redis: a ``redis.asyncio`` client.
        sink: where the ticks go (a Kafka sink on the ingress topic): ``await send(items)``.
        owner: this process's lease identity (unique per process).
        clock: epoch seconds (tests pass their own).
    """

    def __init__(
        self,
        config: ScheduleSourceConfig,
        *,
        pipeline: str,
        redis: Any,
        sink: Any,
        owner: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.pipeline = pipeline
        self.key = keys.schedule(pipeline, config.name)
        self._sink = sink
        self._owner = owner
        self._clock = clock
        self._cron = Cron.parse(config.cron) if config.cron is not None else None
        self._redis = redis
        self._claim = redis.register_script(_CLAIM)
        self._advance = redis.register_script(_ADVANCE)
        self._release = redis.register_script(_RELEASE)
        self._key_bytes = config.name.encode()
        self.holding = False
        self.counters = {"emitted": 0, "late": 0, "missed": 0, "errors": 0, "lease_lost": 0}

    async def run_once(self) -> float:
        """One pass; returns the seconds to wait before the next one."""
        now_ms = round(self._clock() * 1000)
        lease_ms = round(LEASE_S * 1000)
        held, value = await self._claim(
            keys=[self.key], args=[self._owner, now_ms, lease_ms, round(STATE_TTL_S * 1000)]
        )
        if not held:
            self.holding = False
            return LEASE_S / 3
        self.holding = True
        through = int(value)
        due = await asyncio.to_thread(due_ticks, self.config, through, now_ms, self._cron)
        if due.emit:
            events = [
                (tick_event(self.config, self.pipeline, t), self._key_bytes) for t in due.emit
            ]
            await self._sink.send(events)
        if due.through != through:
            ok = await self._advance(
                keys=[self.key],
                args=[self._owner, str(through), str(due.through), len(due.emit), due.missed],
            )
            if not ok:
                self.counters["lease_lost"] += 1
                log.warning(
                    "pipeline %r: schedule %r lost its lease while emitting %d ticks; the next holder may emit them again (the pipeline's delivery.dedupe removes the copies)",
                    self.pipeline,
                    self.config.name,
                    len(due.emit),
                )
                return 0.0
        self.counters["emitted"] += len(due.emit)
        self.counters["late"] += due.late
        self.counters["missed"] += due.missed
        if due.missed:
            log.warning(
                "pipeline %r: schedule %r skipped %d ticks missed while no replica ran (catch_up: %s, misfire_grace_s: %g)",
                self.pipeline,
                self.config.name,
                due.missed,
                self.config.catch_up,
                self.config.misfire_grace_s,
            )
        if due.more:
            return 0.0
        after = max(due.through, now_ms) / 1000
        upcoming = _ticks(
            self.config, self._cron, round(after * 1000), round((after + LEASE_S) * 1000)
        )
        wait = LEASE_S / 3
        if upcoming:
            wait = min(wait, upcoming[0] / 1000 - self._clock())
        return max(0.0, wait)

    async def run(self, stop: asyncio.Event) -> None:
        """Pass after pass until ``stop`` is set; then give the lease back."""
        try:
            while not stop.is_set():
                try:
                    wait = await self.run_once()
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - Redis or the broker down: try again
                    self.counters["errors"] += 1
                    log.warning(
                        "pipeline %r: schedule %r: a pass failed (%s: %s); retrying (its ticks stay due)",
                        self.pipeline,
                        self.config.name,
                        type(e).__name__,
                        e,
                    )
                    wait = 1.0
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
        finally:
            await self.release()

    async def release(self) -> None:
        """Give the lease back (another replica takes over at its next pass)."""
        if not self.holding:
            return
        try:
            await self._release(keys=[self.key], args=[self._owner])
        except Exception as e:  # noqa: BLE001 - it expires by itself
            log.debug("releasing schedule %r failed: %s", self.config.name, e)
        self.holding = False
