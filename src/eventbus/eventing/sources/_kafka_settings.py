"""The runtime settings of a Kafka source, beside its YAML config (:class:`KafkaSourceConfig`).

Three cohesive groups instead of a long constructor: where the source delivers
(:class:`SourceSinks`), how it fetches and batches (:class:`FetchSettings`), and how it retries
and suppresses duplicates on the way to the sinks (:class:`DeliveryPolicy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from eventbus._internal.backoff import FULL_JITTER, Backoff
from eventbus.eventing.sources._kafka_errors import GIVE_UP_S

if TYPE_CHECKING:
    from eventbus.eventing._delivery import RedisDeduper, RetryPolicy
    from eventbus.eventing._routing import Routing
    from eventbus.eventing.sinks._base import Sink

__all__ = ["DeliveryPolicy", "Doorbell", "FetchSettings", "JoinBridge", "SourceSinks"]


@dataclass(frozen=True, slots=True)
class SourceSinks:
    """Where a source's events go. The source owns their lifecycle: it starts and stops them.

    Args:
        sink: where output events go.
        dead_letter: where failed and undecodable events go; None logs and counts them.
        routing: named sinks and the routes over them; when given, ``sink`` is unused (pass
            any of them) and outputs go where the routes say.

    Example:
        >>> SourceSinks(sink=my_sink, dead_letter=None)  # doctest: +SKIP
    """

    sink: Sink
    dead_letter: Sink | None = None
    routing: Routing | None = None


@dataclass(frozen=True, slots=True)
class FetchSettings:
    """How a Kafka source fetches records and makes batches of them.

    Args:
        max_batch: most records per batch.
        linger_ms: the least time between two fetches while records keep coming (a fetch
            that fills a batch is followed at once): what arrives meanwhile makes one batch
            and one fetch. Fewer fetches matter on Tansu's memory storage, where a fetch
            lists every record batch of the partition.
        max_in_flight: most batches dispatched concurrently (outputs and commits stay in order).
        session_timeout_ms: the consumer-group session timeout; None: the source config's
            ``session_timeout_ms`` (YAML, default 10000; Apache Kafka's brokers take 6000 to
            1800000 by default). Tansu holds a group's first join for half of it, so there it
            is also roughly the delay before the first record.
        heartbeat_interval_ms: how often the consumer heartbeats, below the session timeout;
            None: the source config's ``heartbeat_interval_ms`` (default 3000), or with a
            ``session_timeout_ms`` given here a third of it, at most the config's.
        decode_in_dispatch: hand ``dispatch`` the records undecoded
            (:class:`~eventbus.eventing._codecs.RawRecord`) so that decoding (and, by
            returning :class:`~eventbus.eventing._codecs.KafkaRecord` outputs, encoding)
            happens where dispatch runs: a Ray replica, off the source's single core. A record
            that does not decode there comes back as ``Failure(step="decode")`` and is
            dead-lettered like one that failed in the source.
        revoke_timeout_s: how long a rebalance waits for the batches in flight of the
            partitions being revoked (None: the session timeout, which is about how long the
            group coordinator waits for this member anyway).
        doorbell: tells the source, once idle, when records arrive: it stops fetching
            (parks) until then instead of long-polling (None: it long-polls with
            ``idle_fetch_max_wait_ms``). See :class:`Doorbell`.
        bridge: lets the source consume its partitions by assignment while its group join
            runs, when it is the first member of a group with none live (a pipeline woken
            from zero; None: it waits for the join). See :class:`JoinBridge`.
        in_order: while a batch's dispatch is being retried (Redis restarting, a replica
            dying), the batches after it wait for it, first tries and retries alike, so
            steps whose state depends on the order of a partition's events (a join's first
            or latest match, a watermark) see them in order. Without it the batches in
            flight are retried on their own backoff schedules, and a later one can change
            the state before an earlier one (``emit: first`` then paired an order with its
            second payment). Nothing waits on the happy path. Exact where the steps run on
            the source's loop (joins); with worker threads or source actors a batch already
            dispatched when the one before fails may still run first.

    Example:
        >>> FetchSettings(max_batch=500, linger_ms=5).max_in_flight
        4
    """

    max_batch: int = 2000
    linger_ms: int = 5
    max_in_flight: int = 4
    session_timeout_ms: int | None = None
    heartbeat_interval_ms: int | None = None
    decode_in_dispatch: bool = False
    revoke_timeout_s: float | None = None
    doorbell: Doorbell | None = None
    bridge: JoinBridge | None = None
    in_order: bool = False

    def group_timings(self, session_timeout_ms: int, heartbeat_interval_ms: int) -> tuple[int, int]:
        """The consumer group's (session timeout, heartbeat interval) in ms: these settings',
        else the given ones (the source config's; see the Args)."""
        if self.session_timeout_ms is None:
            return session_timeout_ms, self.heartbeat_interval_ms or heartbeat_interval_ms
        third = max(1, self.session_timeout_ms // 3)
        return self.session_timeout_ms, (
            self.heartbeat_interval_ms or min(heartbeat_interval_ms, third)
        )


class Doorbell(Protocol):
    """Wakes an idle (parked) Kafka source when records arrive on its partitions.

    A long poll does not make an idle source fast on every broker: Tansu answers a waiting
    fetch at fixed points of its wait, not when records arrive, so the first event after
    idleness waited ~250 ms with a 500 ms wait. A parked source sends no fetch at all; one
    watcher for every parked source (EventBus's controller: one ``ListOffsets`` for all their
    partitions every few tens of ms) rings it when a partition's end moves, and the source
    fetches with its low-latency wait.
    """

    async def wait(self, ends: Mapping[str, int]) -> None:
        """Return once records may have arrived past ``ends`` (``topic[partition]`` -> the log
        end the source last saw, -1 when unknown). The source cancels the wait when it stops
        or after a while (it then fetches once anyway); raising makes it wait that while."""


class JoinBridge(Protocol):
    """Bridges the consumer-group join of the first member of a group that has no live one.

    Tansu holds every JoinGroup for half the group's session timeout (5 s with the default
    10 s), so a pipeline woken from zero would wait that long before its first fetch (Apache
    Kafka answers a first join in tens of ms: the controller opens bridges on Tansu only). A
    source
    that :meth:`claim` s the bridge assigns itself every partition of its topics at once
    (positions from the group's committed offsets) while its group member joins beside it;
    the group takes no commit from a non-member once it has a member, so what it delivers is
    committed when the member gets its partitions, by the member, before it hands over and
    :meth:`release` s. Sources that did not claim it wait for :meth:`wait_clear` before they
    join, so no partition is read twice.
    """

    async def claim(self) -> bool:
        """Take the bridge; False: there is none open (the group may have live members)."""

    async def release(self) -> None:
        """The claimer handed over (or stopped): the others may fetch."""

    async def wait_clear(self, timeout_s: float) -> bool:
        """Wait until no source holds the bridge (at most ``timeout_s``); True: one held it
        (positions must be read again from the committed offsets)."""


@dataclass(frozen=True, slots=True)
class DeliveryPolicy:
    """How a source gets events to its sinks: event retries, dedupe, and how long it insists.

    Args:
        retry: retries of events that failed in a step (None: dead-letter at once).
        dedupe: suppresses outputs already delivered (None: no dedupe).
        retry_initial_s: first backoff after a failed dispatch (a replica died, say) or a sink
            send that was not acknowledged.
        retry_max_s: the cap of that backoff.
        retry_jitter: the fraction of each backoff drawn at random (1: full jitter; see
            :class:`eventbus._internal.backoff.Backoff`), so that the sources of a broker that
            failed for all of them do not retry in lockstep.
        dispatch_retries: tries of a whole batch after a dispatch error that is not an
            infrastructure error (see ``_kafka_errors``); then the batch is split in halves
            down to the events that fail alone, which are dead-lettered.
        give_up_s: how long an infrastructure failure of a dispatch or a send is retried
            before the source stops (:class:`SourceStalledError`; nothing is committed past
            it, so its events are consumed again).
        drain_timeout_s: how long stopping waits for the batches in flight.
        exactly_once: each batch's outputs, dead letters and offsets go in a Kafka
            transaction (one partition per batch, one transactional producer per input
            partition; see ``_kafka_txn``); no dedupe, no consumer commits.
        commit_interval_s: exactly_once: how long a partition's transaction stays open for
            its next batches before it commits (0: a transaction per batch).

    Example:
        >>> DeliveryPolicy(retry_initial_s=0.1, retry_max_s=0.3, retry_jitter=0).backoff_s(3)
        0.3
    """

    retry: RetryPolicy | None = None
    dedupe: RedisDeduper | None = None
    retry_initial_s: float = 0.1
    retry_max_s: float = 5.0
    retry_jitter: float = FULL_JITTER
    dispatch_retries: int = 2
    give_up_s: float = GIVE_UP_S
    drain_timeout_s: float = 30.0
    exactly_once: bool = False
    commit_interval_s: float = 0.1
    backoff: Backoff = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        backoff = Backoff(self.retry_initial_s, self.retry_max_s, self.retry_jitter)
        object.__setattr__(self, "backoff", backoff)

    def backoff_s(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1, 2, ...) of a dispatch or
        a send: capped exponential, with jitter."""
        return self.backoff.delay(attempt)
