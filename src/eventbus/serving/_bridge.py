"""The join bridge of a pipeline woken from zero (see
:class:`~eventbus.eventing.sources._kafka_settings.JoinBridge`), kept in Redis.

* The controller, waking a pipeline at zero (its Serve application was deleted, its members
  left the groups), opens a bridge per consumer group: :func:`open_bridges` sets
  ``eventbus:join-bridge:<group>`` to ``open`` for :data:`OPEN_TTL_S`.
* The first source of a woken replica to :meth:`RedisJoinBridge.claim` it writes its id there
  (one script: only one claims) and consumes by assignment while its group join runs,
  refreshing the key's TTL; it deletes the key once its group member took over.
* Any other new member of the group (a second replica) waits until the key is gone
  (:meth:`RedisJoinBridge.wait_clear`) before it joins: the group then rebalances as on any
  scale-up, from the offsets the bridge's member committed; no partition is read by two
  consumers.

Only a broker that holds a first JoinGroup needs it: Tansu holds one for half the session
timeout (3 s of a cold start with a 6 s session, 5 s with 10 s), Apache Kafka with the stack's
``group.initial.rebalance.delay.ms=0`` answers it in ~25-45 ms (aiokafka's ``start()`` of a
woken group's first member, session timeout 6 s or 10 s). :func:`broker_holds_joins` tells
which broker the stack has from the cluster id it reports (Tansu's default): on any other the
controller opens no bridge and the sources join as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from eventbus._internal import keys
from eventbus.eventing._broker import is_tansu
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.pipelines._config import PipelineConfig

__all__ = [
    "CLAIM_TTL_S",
    "OPEN_TTL_S",
    "RedisJoinBridge",
    "bridged_groups",
    "broker_holds_joins",
    "open_bridges",
]

log = logging.getLogger("eventbus.serving.bridge")

#: An open bridge no replica claimed (its start failed) expires after this long.
OPEN_TTL_S = 120
#: A claimed bridge expires this long after its holder's last refresh (the holder died).
CLAIM_TTL_S = 15
_REFRESH_S = 5.0
_WAIT_LOOK_S = 0.05
_ASK_TIMEOUT_S = 3.0  # a wake-up may be waiting for the answer

# KEYS[1] the bridge, ARGV[1] the claimer, ARGV[2] the TTL: only an open bridge is taken
_CLAIM = """
if redis.call('GET', KEYS[1]) == 'open' then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
return 0
"""
# deleted only by its holder (an expired and re-opened bridge is not someone else's to delete)
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def bridged_groups(config: PipelineConfig, bootstrap: str) -> dict[int, str]:
    """Consumed source index -> consumer group, of the sources of a ``min: 0`` pipeline that
    may bridge their join: those on the stack's own Kafka (the watcher's and the ringer's
    cluster; the controller opens their bridges only where it holds joins:
    :func:`broker_holds_joins`)."""
    if not config.spec.serving.replica_bounds.scale_to_zero:
        return {}
    return {
        i: src.group or f"eventbus-{config.name}"
        for i, src in enumerate(config.consumed_sources)
        if src.bootstrap_servers in (None, bootstrap) and src.client is None
    }


def broker_holds_joins(bootstrap: str, client: KafkaClientConfig | None) -> bool:
    """Whether the stack's Kafka holds a first JoinGroup, so that woken pipelines bridge it:
    Tansu only (:func:`~eventbus.eventing._broker.is_tansu`, asked once per process). A broker
    that does not answer within :data:`_ASK_TIMEOUT_S` gives False (no bridge: the sources join
    as usual) and is asked again next time. Blocking: call it off any event loop."""
    return asyncio.run(is_tansu(bootstrap, client, timeout_s=_ASK_TIMEOUT_S))


def open_bridges(redis: Any, groups: Iterable[str]) -> None:
    """Open a bridge for each consumer group of a pipeline being woken (a sync client)."""
    pipe = redis.pipeline(transaction=False)
    for group in groups:
        pipe.set(keys.join_bridge(group), "open", ex=OPEN_TTL_S)
    pipe.execute()


class RedisJoinBridge:
    """One source's side of its group's bridge.

    Args:
        redis_url: the stack's Redis.
        group: the source's consumer group.
        holder: this source's id (``<replica id>/<source index>``).
    """

    def __init__(self, redis_url: str, group: str, holder: str) -> None:
        self.redis_url = redis_url
        self.key = keys.join_bridge(group)
        self.holder = holder
        self._redis: Any = None
        self._refresher: asyncio.Task[None] | None = None

    def _client(self) -> Any:
        if self._redis is None:
            from eventbus._internal.redis_client import connect_async

            self._redis = connect_async(self.redis_url)
        return self._redis

    async def claim(self) -> bool:
        """Take the bridge if it is open (Redis away: no bridge, the source joins as usual)."""
        try:
            taken = await self._client().eval(_CLAIM, 1, self.key, self.holder, CLAIM_TTL_S)
        except Exception as e:  # noqa: BLE001
            log.warning("join bridge %s: claiming failed (%s); joining as usual", self.key, e)
            return False
        if taken:
            self._refresher = asyncio.create_task(self._refresh())
        return bool(taken)

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(_REFRESH_S)
            with contextlib.suppress(Exception):  # it expires by itself at worst
                await self._client().expire(self.key, CLAIM_TTL_S)

    async def release(self) -> None:
        """Delete the bridge if this source holds it; close the connection."""
        task, self._refresher = self._refresher, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._redis is None:
            return
        try:
            await self._redis.eval(_RELEASE, 1, self.key, self.holder)
        finally:
            redis, self._redis = self._redis, None
            await redis.aclose()

    async def wait_clear(self, timeout_s: float) -> bool:
        """Wait while another source holds the bridge (at most ``timeout_s``). True: it did."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        waited = False
        try:
            redis = self._client()
            while loop.time() < deadline:
                holder = await redis.get(self.key)
                if holder is None or holder in (b"open", "open"):
                    break  # none, or nobody claimed it (the claim comes before any join)
                waited = True
                await asyncio.sleep(_WAIT_LOOK_S)
        except Exception as e:  # noqa: BLE001 - Redis away: the positions are read again
            log.warning("join bridge %s: reading it failed (%s)", self.key, e)
            return True
        finally:
            redis, self._redis = self._redis, None
            if redis is not None:
                await redis.aclose()
        return waited
