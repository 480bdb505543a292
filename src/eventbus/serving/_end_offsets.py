"""The doorbell ringer's look at partitions' log ends, through aiokafka's public client.

One :class:`aiokafka.AIOKafkaClient` (the stack's TLS and SASL settings, API versions negotiated
per connection) sends aiokafka's own ``ListOffsets`` request (:class:`OffsetRequest`, the
latest offset of each partition), one per leader, built once per set of partitions and sent
again at every look over the connections it keeps open. Leaders come from aiokafka's
``Metadata`` request for the topics looked at, with ``allow_auto_topic_creation`` off (a broker
with ``auto.create.topics.enable``, as the stack's, would otherwise create a deleted topic
again), asked at most once a second when a partition has no leader or answered an error.

The client runs on a private event loop that the calling thread (the controller's ringer, no
loop of its own) turns for each look: between looks nothing runs, so a look costs its
requests and one turn of that loop, and an idle controller nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any

from aiokafka import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.offset import OffsetRequest

from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs
from eventbus.eventing._kafka_live_password import follow_password

__all__ = ["EndOffsets", "EndOffsetsError", "leaders_of", "log_ends_of"]

_LATEST = -1  # ListOffsets' timestamp asking the log end
_READ_UNCOMMITTED = 0  # the high watermark, as the fetches of a parked source see it
_METADATA_EVERY_S = 1.0  # leaders asked again at most this often (a deleted topic)


class EndOffsetsError(OSError):
    """A look at the log ends failed: no broker answered, or a leader could not be reached."""


def leaders_of(response: Any) -> tuple[set[int], dict[tuple[str, int], int]]:
    """A ``Metadata`` answer (any version aiokafka speaks): the broker ids, and (topic,
    partition) -> leader node of the partitions that have one (a topic with an error, or a
    partition without a leader, is left out)."""
    brokers = {int(b[0]) for b in response.brokers}
    leaders: dict[tuple[str, int], int] = {}
    for error, topic, *rest in response.topics:
        if error:
            continue
        for p_error, part, leader, *_ in rest[-1]:  # v0 has no is_internal before them
            if not p_error and leader >= 0:
                leaders[(topic, part)] = leader
    return brokers, leaders


def log_ends_of(response: Any) -> tuple[dict[str, int], bool]:
    """A ``ListOffsets`` answer: ``topic[partition]`` -> log end of the partitions that
    answered without error, and whether some partition answered with one."""
    ends: dict[str, int] = {}
    errors = False
    v0 = response.API_VERSION == 0  # a list of offsets instead of (timestamp, offset)
    for topic, parts in response.topics:
        for part, error, *info in parts:
            offset = (info[0][0] if info[0] else None) if v0 else info[-1]
            if error or offset is None or offset < 0:
                errors = True
            else:
                ends[f"{topic}[{part}]"] = offset
    return ends, errors


def _request(partitions: Collection[tuple[str, int]]) -> OffsetRequest:
    topics: dict[str, list[tuple[int, int]]] = {}
    for topic, part in sorted(partitions):
        topics.setdefault(topic, []).append((part, _LATEST))
    return OffsetRequest(-1, _READ_UNCOMMITTED, list(topics.items()))


class EndOffsets:
    """Log ends of partitions, for a thread without an event loop (see the module).

    Not thread-safe: one thread looks. Args:
        bootstrap: ``host:port[,host:port...]``.
        client: the stack's Kafka connection settings (TLS, SASL); None: plaintext.
        client_id: the client id the broker logs.
        timeout_s: the longest one look waits (connecting included).
    """

    def __init__(
        self,
        bootstrap: str,
        client: KafkaClientConfig | None = None,
        *,
        client_id: str = "eventbus-doorbell",
        timeout_s: float = 5.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.client = client
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kafka: AIOKafkaClient | None = None
        self._leaders: dict[tuple[str, int], int] = {}
        self._meta_at = -_METADATA_EVERY_S
        self._stale = True  # leaders to be asked again
        #: the request of each leader for the partitions looked at last
        self._requests: dict[int, OffsetRequest] = {}
        self._asked: frozenset[tuple[str, int]] = frozenset()

    def ends(self, partitions: Collection[tuple[str, int]]) -> dict[str, int]:
        """``topic[partition]`` -> log end, for the partitions that have a leader now.

        Raises:
            EndOffsetsError: no broker answered, a leader could not be reached or the look
                took longer than ``timeout_s``; the connections are kept, the leaders asked
                again at the next look.
        """
        wanted = frozenset(partitions)
        if not wanted:
            return {}
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        try:
            return self._loop.run_until_complete(self._look(wanted))
        except TimeoutError as e:
            self._stale = True
            msg = f"no answer from the Kafka at {self.bootstrap} in {self.timeout_s:g} s"
            raise EndOffsetsError(msg) from e
        except EndOffsetsError:
            self._stale = True
            raise
        except (KafkaError, OSError) as e:
            self._stale = True
            msg = f"looking at the log ends on the Kafka at {self.bootstrap} failed: {e!r}"
            raise EndOffsetsError(msg) from e

    def close(self) -> None:
        """Close the connections and the loop (idempotent; a later look opens them again)."""
        loop, self._loop = self._loop, None
        kafka, self._kafka = self._kafka, None
        if loop is None:
            return
        try:
            if kafka is not None:
                loop.run_until_complete(kafka.close())
        finally:
            loop.close()
            self._stale, self._asked = True, frozenset()

    async def _look(self, wanted: frozenset[tuple[str, int]]) -> dict[str, int]:
        kafka = self._kafka
        unknown = not wanted <= self._leaders.keys()
        due = time.monotonic() - self._meta_at >= _METADATA_EVERY_S
        if kafka is None or ((self._stale or unknown) and due):
            async with asyncio.timeout(self.timeout_s):  # connecting, asking the leaders
                kafka = await self._prepare(wanted)
        if wanted != self._asked:
            by_node: dict[int, list[tuple[str, int]]] = {}
            for tp in wanted:
                node = self._leaders.get(tp)
                if node is not None:
                    by_node.setdefault(node, []).append(tp)
            self._requests = {n: _request(tps) for n, tps in by_node.items()}
            self._asked = wanted
        # each send is bounded by the client's request_timeout_ms (timeout_s); with one
        # leader (a single broker) no task is made: a look is a few turns of the loop
        if len(self._requests) == 1:
            ((node, request),) = self._requests.items()
            answers = [await kafka.send(node, request)]
        else:
            answers = await asyncio.gather(*(kafka.send(n, r) for n, r in self._requests.items()))
        out: dict[str, int] = {}
        for answer in answers:
            ends, errors = log_ends_of(answer)
            out.update(ends)
            self._stale = self._stale or errors
        return out

    async def _prepare(self, wanted: frozenset[tuple[str, int]]) -> AIOKafkaClient:
        kafka = self._kafka
        if kafka is None:
            kafka = AIOKafkaClient(
                bootstrap_servers=self.bootstrap,
                client_id=self.client_id,
                request_timeout_ms=int(self.timeout_s * 1000),
                **kafka_client_kwargs(self.client),
            )
            follow_password(kafka, self.client)  # a rotated SASL password: no restart
            try:
                await kafka.bootstrap()
            except BaseException:
                await kafka.close()
                raise
            self._kafka = kafka
        if self._stale or not wanted <= self._leaders.keys():
            await self._metadata(kafka, {t for t, _ in wanted})
            self._asked = frozenset()
        return kafka

    async def _metadata(self, kafka: AIOKafkaClient, topics: set[str]) -> None:
        self._meta_at = time.monotonic()
        node = kafka.get_random_node()
        if node is None:
            msg = f"the Kafka at {self.bootstrap} named no broker"
            raise EndOffsetsError(msg)
        request = MetadataRequest(sorted(topics), allow_auto_topic_creation=False)
        brokers, leaders = leaders_of(await kafka.send(node, request))
        if any(kafka.cluster.broker_metadata(b) is None for b in brokers):
            await kafka.force_metadata_update()  # a broker joined: the client learns its address
        # a topic without leaders (deleted, not created yet) is not looked at until it has some
        self._leaders, self._stale = leaders, False
