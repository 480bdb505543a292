"""The idle waits of the Kafka source's fetcher: an idle source (no record for
``IDLE_AFTER_S``) with a doorbell parks (pauses its partitions, fetches nothing until the
doorbell rings, :meth:`~FetchWaits.unpark` or :data:`PARK_MAX_S`); without one it long-polls
(``idle_fetch_max_wait_ms``). :class:`~eventbus.eventing.sources._kafka_fetch.KafkaFetcher`
mixes it in.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition

from eventbus.eventing._aiokafka_adapter import quiet_fetch_routine, set_fetch_wait
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.eventing.sources._kafka_settings import Doorbell

__all__ = ["PARK_MAX_S", "FetchWaits"]

# One logger for every part of the Kafka source, as when it was one module.
log = logging.getLogger("eventbus.eventing.sources._kafka")

#: A parked source fetches once anyway after this long without its doorbell ringing (the
#: watcher may be away: a controller restart; the restarted ringer reads the parked entries
#: from Redis and rings them, so this bounds only a ringer that stays away), then parks again
#: and refreshes its parked entry (older than the doorbell's ``STALE_S``, 60 s, it is dropped).
#: Each park costs a fetch or two and a Redis round trip: 5 s made 10 idle pipelines send ~6
#: requests a second to the broker; 20 s, ~1.5.
PARK_MAX_S = 20.0


class FetchWaits:
    """Park and long poll of :class:`KafkaFetcher`."""

    config: KafkaSourceConfig
    pipeline: str
    idle: bool
    parks: int
    _unparked: asyncio.Event
    _doorbell: Doorbell | None
    _tansu: bool
    held: set[TopicPartition]

    def unpark(self) -> None:
        """End a park now (the source stops); later parks are not affected."""
        self._unparked.set()

    async def _park(self, consumer: AIOKafkaConsumer, doorbell: Doorbell) -> bool:
        """Idle with a doorbell: pause every partition (no fetch goes to the broker) until the
        doorbell rings, :meth:`unpark` is called or :data:`PARK_MAX_S` passed; then resume.
        Whether it rang. A doorbell that fails (its Redis refuses pub/sub: an ACL without
        channels, a cluster) is dropped for good: the source long-polls from then on."""
        parts = consumer.assignment()
        if not parts or self._unparked.is_set():
            return False
        self.parks += 1
        consumer.pause(*parts)
        seen = {f"{tp.topic}[{tp.partition}]": consumer.highwater(tp) for tp in parts}
        ends = {k: -1 if end is None else end for k, end in seen.items()}
        rung = asyncio.ensure_future(doorbell.wait(ends))
        unparked = asyncio.ensure_future(self._unparked.wait())
        # aiokafka's fetch routine otherwise wakes every 0.2 s to find nothing to fetch
        with quiet_fetch_routine(consumer, PARK_MAX_S):
            try:
                await asyncio.wait(
                    {rung, unparked}, timeout=PARK_MAX_S, return_when="FIRST_COMPLETED"
                )
            finally:
                for task in (rung, unparked):
                    task.cancel()
                await asyncio.gather(rung, unparked, return_exceptions=True)
                # a rebalance may have moved some; a take holds its own paused
                owned = (parts & consumer.assignment()) - self.held
                if owned:
                    consumer.resume(*owned)  # wakes the fetch routine at once
        if rung.done() and not rung.cancelled() and rung.exception() is not None:
            log.warning(
                "kafka source %s: its doorbell failed (%s: %s); long-polling instead",
                self.pipeline,
                type(rung.exception()).__name__,
                rung.exception(),
            )
            self._doorbell = None
            self._set_idle(consumer, True)
            return False
        return rung.done() and not rung.cancelled()

    def _set_idle(self, consumer: AIOKafkaConsumer, idle: bool) -> None:
        """Switch the fetch requests between the long poll (idle) and the low-latency wait.

        An idle source that sent a fetch every ``fetch_max_wait_ms`` (10 ms) cost ~6% of a
        core in the replica and ~4.5% in the broker; a long poll costs a fetch every
        ``idle_fetch_max_wait_ms``. aiokafka reads the wait when it builds each fetch request,
        so the next request after the first records is short again. A broker that answers a
        waiting fetch when data arrives (Kafka) adds no latency; one that holds it for the
        whole wait (Tansu) delays the first record after idleness by up to the idle wait.
        """
        self.idle = idle
        long_poll = idle and self._doorbell is None  # parked sources do not fetch
        wait = self.config.idle_fetch_max_wait_ms if long_poll else self.config.fetch_max_wait_ms
        if not self._tansu:  # every fetch long-polls from the start (see _consumer_kwargs)
            return
        set_fetch_wait(consumer, wait)
        log.debug(
            "kafka source %s: %s (fetch wait %d ms)",
            self.pipeline,
            "idle" if idle else "busy",
            wait,
        )
