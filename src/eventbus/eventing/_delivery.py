"""Delivery policies a source applies between dispatch and the sinks: retries and dedupe.

* :class:`RetryPolicy`: an event that failed in a step is dispatched again (alone with the
  other failures of its batch, never with its batch-mates) after the exponential backoff with
  jitter of :class:`eventbus._internal.backoff.Backoff`, up to the step's retry count and the
  policy's maximum age; then it is dead-lettered.
* :class:`RedisDeduper`: effectively-once at the sink: output events whose CloudEvent
  ``source`` + ``id`` were already delivered within the window are not sent again. Before a
  send, each output is *claimed*: marked pending, with the sink's lower bounds of where its
  records will land. After the sink's acknowledgement the marks become *done*. An output found
  pending (its sender died between the claim and the done mark) is looked up in the sink from
  those bounds: found, it is skipped; not found, it is sent. So a process killed at any point
  neither loses nor duplicates an output (a live process racing another on the same output id
  still can: that needs a zombie, which the consumer group fences on its next commit).
  While Redis does not answer (a restart replaying its append-only file, a failover), a claim
  waits for it, up to :data:`CLAIM_WAIT_S`: delivering unclaimed would send again the outputs
  of a batch consumed again (after a crash or a rebalance) that were delivered before.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eventbus._internal import keys
from eventbus._internal.backoff import FULL_JITTER, Backoff
from eventbus.eventing._codecs import KafkaRecord
from eventbus.eventing._event import CloudEvent

__all__ = ["RedisDeduper", "RetryPolicy", "dedupe_key", "injected_fault"]

log = logging.getLogger(__name__)

#: Fault injection for the tests (unset in production: then the hook costs one comparison).
_FAULTS_DIR = os.environ.get("EVENTBUS_FAULTS_DIR")


def injected_fault(pipeline: str, point: str) -> None:
    """Test hook: the process dies at once (as by kill -9) when the file
    ``$EVENTBUS_FAULTS_DIR/<pipeline>.<point>`` exists; removing it first means exactly one
    process fires. Points: ``after-claim`` (outputs claimed, nothing sent), ``after-sink-ack``
    (outputs in the sink, not marked done)."""
    if _FAULTS_DIR is None:
        return
    try:
        os.unlink(os.path.join(_FAULTS_DIR, f"{pipeline}.{point}"))
    except FileNotFoundError:
        return
    log.error("fault injection: %s dies at %s", pipeline, point)
    os._exit(137)


#: Steps whose failures are never retried: the input itself or the output cannot be handled.
_FINAL_STEPS = frozenset(("decode", "sink", "dispatch"))


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of events that failed in a step.

    Args:
        retries: retries per failing event (0: dead-letter at once).
        initial_s: first delay.
        max_s: largest delay.
        jitter: fraction of each delay drawn at random (1: anywhere up to the delay, "full
            jitter"; 0.2: 80-100 % of it), so replicas that failed together do not retry
            together.
        max_age_s: stop retrying once this long has passed since the first failure (None:
            only ``retries`` limits).
        per_step: retry counts that override ``retries`` for some step ids.
    """

    retries: int = 0
    initial_s: float = 0.1
    max_s: float = 5.0
    jitter: float = FULL_JITTER
    max_age_s: float | None = None
    per_step: Mapping[str, int] = field(default_factory=dict)
    backoff: Backoff = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "backoff", Backoff(self.initial_s, self.max_s, self.jitter))

    @classmethod
    def from_config(cls, spec: Any) -> RetryPolicy:
        """The policy of a pipeline spec (``delivery:`` and the steps' ``retries:``)."""
        d = spec.delivery
        per_step = {s.id: s.retries for s in spec.steps if getattr(s, "retries", None) is not None}
        return cls(
            d.retries,
            d.backoff.initial_ms / 1000,
            d.backoff.max_ms / 1000,
            d.backoff.jitter,
            d.max_age_s,
            per_step,
        )

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
        return self.backoff.delay(attempt)


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


#: Claim outputs before a send: new keys get the pending value (returned as ''), the others
#: return what they hold ('1': delivered; 'P...': pending, sender unknown). The keys are
#: KEYS, all of one pipeline's hash tag (one Redis Cluster slot).
_CLAIM = """
local px = ARGV[1]
local pending = ARGV[2]
local out = {}
for i = 1, #KEYS do
  local cur = redis.call('GET', KEYS[i])
  if cur then
    out[#out + 1] = cur
  else
    redis.call('SET', KEYS[i], pending, 'PX', px)
    out[#out + 1] = ''
  end
end
return out
"""

_MARK = """
local px = ARGV[1]
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], '1', 'PX', px)
end
return #KEYS
"""


#: How long a claim waits for Redis to answer again before the outputs go without dedupe
#: (fail open: a possible duplicate rather than a stalled pipeline).
CLAIM_WAIT_S = 60.0
#: The pause between claims while Redis does not answer (50 ms doubling up to 2 s, jittered).
_CLAIM_BACKOFF = Backoff(initial_s=0.05, max_s=2.0)
#: Redis errors that say the server is away for now (redis-py's, by class name).
_AWAY = frozenset(("ConnectionError", "TimeoutError", "BusyLoadingError"))


class RedisDeduper:
    """Remembers delivered output events (``source`` + ``id``) in Redis for ``window_s``.

    Args:
        redis_url: the Redis server.
        pipeline: the pipeline (keys are ``eventbus:dedupe:{<pipeline>}:<digest>``).
        window_s: how long a delivered event is remembered.
    """

    def __init__(self, redis_url: str, pipeline: str, window_s: float) -> None:
        from eventbus._internal.redis_client import connect_async

        self._redis = connect_async(redis_url)
        self._prefix = keys.dedupe_prefix(pipeline)
        self._window_ms = int(window_s * 1000)
        self._mark = self._redis.register_script(_MARK)
        self._claim = self._redis.register_script(_CLAIM)
        self.errors = 0
        #: Pending outputs looked up in the sink (after a crash), and how many were found there.
        self.resolved = 0
        self.found_in_sink = 0

    def _key(self, k: str) -> str:
        return self._prefix + hashlib.blake2b(k.encode(), digest_size=12).hexdigest()

    def digests(self, keys: Sequence[str | None]) -> list[str | None]:
        """The Redis keys of ``keys`` (hashed once, before the sink is awaited, so that the
        mark right after its acknowledgement costs one round trip and nothing more)."""
        return [None if k is None else self._key(k) for k in keys]

    async def claim(self, keys: Sequence[str | None], sink: Any) -> list[bool]:
        """Which outputs to skip (delivered already, or a repeat within ``keys``); claim the
        others: mark them pending with ``sink``'s positions, so that if this process dies
        before :meth:`mark`, the next one to see them can search the sink for them.

        Args:
            keys: hashed keys (from :meth:`digests`); None for outputs without an id.
            sink: the sink the outputs go to (its ``positions`` and ``written_keys``).

        While Redis does not answer, the claim is tried again (backoff up to 2 s) for
        :data:`CLAIM_WAIT_S`; then, or on another Redis error, nothing is skipped (fail open).
        When the sink cannot be searched, pending outputs are sent again (a possible duplicate,
        never a loss).
        """
        wanted = [k for k in keys if k is not None]
        if not wanted:
            return [False] * len(keys)
        positions = await sink.positions()
        topic = getattr(getattr(sink, "config", None), "topic", "")
        where = "" if positions is None else ",".join(f"{p}={o}" for p, o in positions.items())
        tries: list[bytes] = []  # the pending value of each try, the last one's last
        found = await self._claim_waiting(wanted, f"|{topic}|{where}", tries)
        if found is None:
            return [False] * len(keys)
        own_b, lost = tries[-1], set(tries[:-1])
        skip: list[bool] = []
        pending: dict[bytes, list[int]] = {}  # pending value -> indexes into ``keys``
        ours: set[str] = set()  # keys an earlier try claimed (its answer lost): not sent yet
        it = iter(found)
        for i, k in enumerate(keys):
            if k is None:
                skip.append(False)
                continue
            v = next(it)
            if not v:
                skip.append(False)
            elif v == b"1" or v == own_b:
                skip.append(True)
            elif v in lost:  # the first of them is new, a repeat within ``keys`` is not
                skip.append(k in ours)
                ours.add(k)
            else:
                skip.append(False)
                pending.setdefault(v, []).append(i)
        if pending:
            await self._resolve(keys, pending, sink, topic, skip)
        return skip

    async def _claim_waiting(self, wanted: list[str], where: str, tries: list[bytes]) -> Any:
        """The claim script's answer, waiting out a Redis that is away; None: fail open.

        Each try claims with a pending value of its own (appended to ``tries``): a try whose
        answer was lost (the connection dropped after the script ran) leaves its keys holding
        its value, which the caller knows as its own claim, not as a delivery."""
        deadline = time.monotonic() + CLAIM_WAIT_S
        attempt = 0
        while True:
            own = f"P{os.urandom(6).hex()}{where}"
            tries.append(own.encode())
            try:
                found: list[Any] = await self._claim(keys=wanted, args=[self._window_ms, own])
                return found
            except Exception as e:  # noqa: BLE001
                self.errors += 1
                away = any(c.__name__ in _AWAY for c in type(e).__mro__)
                left = deadline - time.monotonic()
                if not away or left <= 0:
                    log.warning("dedupe: Redis did not answer (%s); delivering without dedupe", e)
                    return None
                attempt += 1
                delay = min(_CLAIM_BACKOFF.delay(attempt), left)
                log.warning(
                    "dedupe: Redis did not answer (%s); claim tried again in %.2f s", e, delay
                )
                await asyncio.sleep(delay)

    async def _resolve(
        self,
        keys: Sequence[str | None],
        pending: dict[bytes, list[int]],
        sink: Any,
        topic: str,
        skip: list[bool],
    ) -> None:
        """Search the sink for outputs another process claimed and did not mark done."""
        floors: dict[int, int] = {}
        for value in pending:
            _, claimed_topic, where = value.decode(errors="replace").split("|", 2)
            if claimed_topic != topic or not where:
                continue  # another sink (the pipeline was redeployed) or one that cannot be searched
            for part in where.split(","):
                p, o = part.split("=")
                floors[int(p)] = min(int(o), floors.get(int(p), int(o)))
        indexes = [i for idx in pending.values() for i in idx]
        self.resolved += len(indexes)
        if not floors:
            return
        try:
            written = {self._key(k) for k in await sink.written_keys(floors)}
        except Exception as e:  # noqa: BLE001
            log.warning(
                "dedupe: cannot search sink %r for %d unfinished outputs (%s); sending them again",
                topic,
                len(indexes),
                e,
            )
            return
        done = []
        for i in indexes:
            if keys[i] in written:
                skip[i] = True
                done.append(keys[i])
        self.found_in_sink += len(done)
        log.info(
            "dedupe: %d outputs left unfinished by a crashed process; %d of them were in sink %r already",
            len(indexes),
            len(done),
            topic,
        )
        await self.mark(done, hashed=True)

    async def mark(self, keys: Sequence[str | None], *, hashed: bool = False) -> None:
        """Remember keys as delivered (after the sink acknowledged them)."""
        wanted = [k if hashed else self._key(k) for k in keys if k is not None]
        if not wanted:
            return
        try:
            # One script call with every key in KEYS: packing thousands of separate
            # SET commands costs more Python time than Redis spends on them.
            await self._mark(keys=wanted, args=[self._window_ms])
        except Exception as e:  # noqa: BLE001
            self.errors += 1
            log.warning("dedupe: marks not written (%s); a redelivery may duplicate", e)

    async def close(self) -> None:
        await self._redis.aclose()
