"""The join bridge's consumer: every partition of a source's topics by assignment, for the time
a consumer-group join takes (see :class:`~eventbus.eventing.sources._kafka_settings.JoinBridge`).

Tansu holds a JoinGroup for half the group's session timeout (``join_group_pause`` in its group
coordinator), so the first member of a group waits seconds before its first fetch (Apache
Kafka answers one in tens of ms: the controller opens bridges on Tansu only). A consumer with
the same ``group_id`` that assigns itself the partitions needs no join: its positions come
from the group's committed offsets (``OffsetFetch``). Once the group has a member, the group
takes commits only from members (Tansu as Kafka): what the bridge consumer delivered is
committed by the source's member when it gets its partitions (the hand-over). It is safe only
while no other consumer reads those partitions: the bridge is claimed once per wake-up, and
other new members join only after its release. :class:`Bridging` is the fetcher's side (the
hand-over); :class:`~eventbus.eventing.sources._kafka_fetch.KafkaFetcher` mixes it in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from eventbus.eventing._kafka_live_password import follow_password
from eventbus.eventing.sources._kafka_gaps import OffsetGaps
from eventbus.eventing.sources._kafka_settings import JoinBridge

if TYPE_CHECKING:
    from eventbus.eventing._kafka_client import KafkaClientConfig

__all__ = ["BRIDGE_WAIT_S", "Bridging", "open_bridge"]

log = logging.getLogger("eventbus.eventing.sources._kafka")

#: Longest a new group member waits, in its assignment, for another source's join bridge.
BRIDGE_WAIT_S = 30.0


async def open_bridge(
    topics: list[str],
    group: str,
    kwargs: dict[str, Any],
    client: KafkaClientConfig | None = None,
) -> AIOKafkaConsumer | None:
    """A started consumer of ``group`` assigned every partition of ``topics``, or None when a
    topic has no partitions yet (created on first produce) or the broker refused: the source
    then waits for its group join as usual."""
    consumer = AIOKafkaConsumer(group_id=group, **kwargs)
    follow_password(consumer, client)
    try:
        await consumer.start()
        await consumer.topics()  # the cluster's metadata, with every topic's partitions
        tps: list[TopicPartition] = []
        for topic in topics:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                await consumer.stop()
                return None
            tps.extend(TopicPartition(topic, p) for p in sorted(parts))
        consumer.assign(tps)
    except (KafkaError, KeyError) as e:
        log.warning("kafka source of group %r: no join bridge (%s); joining as usual", group, e)
        await consumer.stop()
        return None
    return consumer


class Bridging:
    """The join bridge's hand-over of :class:`KafkaFetcher`."""

    pipeline: str
    consumer: AIOKafkaConsumer | None
    gaps: OffsetGaps
    idle: bool
    _bridge: JoinBridge | None
    _group: AIOKafkaConsumer | None
    _fetching: asyncio.Lock
    _retired: AIOKafkaConsumer | None
    _generation: int
    _last_records_at: float

    def _assigned_hook(
        self,
        on_assigned: Callable[[set[TopicPartition]], Awaitable[None]],
        on_bridged: Callable[[], Awaitable[None]] | None,
    ) -> Callable[[set[TopicPartition]], Awaitable[None]]:
        async def assigned(tps: set[TopicPartition]) -> None:
            if self._group is not None and on_bridged is not None:
                await on_bridged()  # the member has its partitions: the bridge hands over
            await on_assigned(tps)

        return assigned

    @property
    def bridging(self) -> bool:
        """Whether a bridge consumer fetches while the group member joins."""
        return self._group is not None

    async def quiet(self) -> None:
        """Wait until no fetch is in progress."""
        async with self._fetching:
            pass

    async def commit_as_member(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` (what the bridge consumer delivered) as the group member, through
        its public ``commit()``: the group takes commits only from its members once it has
        one. The member owns every partition the bridge read (it is the group's only member:
        the others wait for the bridge's release); a partition it does not own (a member that
        joined after :data:`BRIDGE_WAIT_S`) is left to its owner, who reads it again from the
        older commit (at-least-once), with a warning.

        Raises:
            KafkaError: the commit failed.
        """
        member = self._group
        if member is None or not offsets:
            return
        owned = member.assignment()
        mine = {tp: offset for tp, offset in offsets.items() if tp in owned}
        if len(mine) < len(offsets):
            log.warning(
                "kafka source %s: the join bridge read %s, which its group member does not own; "
                "their owner reads them again from the older commit",
                self.pipeline,
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(set(offsets) - owned)),
            )
        if mine:
            await member.commit(mine)

    async def hand_over(self) -> None:
        """The group member takes over from the bridge consumer (whose batches the source
        delivered and committed): it starts from the committed offsets; the bridge is
        released."""
        member = self._group
        if member is None:
            return
        async with self._fetching:
            bridge, self.consumer, self._group = self.consumer, member, None
            self._retired = bridge
            self._generation += 1
            self.gaps.reset()
            self.idle = False
            self._last_records_at = asyncio.get_running_loop().time()
        try:
            if bridge is not None:
                await bridge.stop()
            assigned = member.assignment()
            if assigned:  # failing, the member starts from what it read at its assignment
                await member.seek_to_committed(*assigned)
        finally:
            await self._close_bridge(bridge_of=True)
        log.info("kafka source %s: the group member took over from the bridge", self.pipeline)

    async def _close_bridge(self, *, bridge_of: bool) -> None:
        if bridge_of and self._bridge is not None:
            try:
                await self._bridge.release()
            except Exception as e:  # noqa: BLE001 - it expires by itself
                log.warning(
                    "kafka source %s: releasing the join bridge failed: %s", self.pipeline, e
                )
