"""Delivery of one batch's outputs to each of their sinks, every sink on its own.

Each sink gets its share of the outputs (see :class:`~eventbus.eventing._routing.Routing`):
claimed in the dedupe store under the sink's name, sent until acknowledged (each sink retried
on its own clock: :func:`send_bounded`), marked done. Sinks run concurrently, so one that is
down holds back only its own deliveries. A sink with ``reply: true`` hands back the
subscriber's replies, which go on to the next sink of the route, the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eventbus.eventing._codecs import KafkaRecord
from eventbus.eventing._delivery import RedisDeduper, dedupe_key, injected_fault
from eventbus.eventing._outcome import Failure
from eventbus.eventing._routing import Routing, Turn, as_event
from eventbus.eventing.sources._kafka_batch import Keyed
from eventbus.eventing.sources._kafka_send import send_bounded
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy

__all__ = ["FanOut", "SinkFailure"]

log = logging.getLogger("eventbus.eventing.sources._kafka")

#: Name of the one sink of a pipeline without routes (its dedupe keys carry no sink name).
SINGLE = "sink"


@dataclass(frozen=True, slots=True)
class SinkFailure:
    """An output a sink will never take: its input is dead-lettered."""

    origin: int  # the output's index in the batch's outputs
    failure: Failure
    attributes: dict[str, Any]


class _Releasing:
    """A batch's turn, given up at each sink as soon as the batch is done with it."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn

    async def wait(self, sink: str) -> None:
        await self.turn.wait(sink)


class FanOut:
    """Sends outputs to their sinks (see the module docstring).

    Args:
        routing: the sinks and routes.
        routed: whether the pipeline has routes (its dedupe keys and dead letters name the
            sink); False for a single ``sink``.
        pipeline: for logs, fault injection and dead letters.
        policy: dedupe and retry bounds.
        stats: the source's counters (``outputs``, ``duplicates``, ``too_large``).
    """

    def __init__(
        self,
        routing: Routing,
        routed: bool,
        pipeline: str,
        policy: DeliveryPolicy,
        stats: dict[str, int],
    ) -> None:
        self.routing = routing
        self._routed = routed
        self._pipeline = pipeline
        self._policy = policy
        self._dedupe: RedisDeduper | None = policy.dedupe
        self._stats = stats

    async def send(
        self,
        outputs: Sequence[Keyed],
        by_sink: dict[str, list[tuple[int, str | None]]],
        seq: int,
        turn: Turn | None,
        release: bool = False,
    ) -> list[SinkFailure]:
        """Deliver ``outputs`` as planned (``by_sink``: per sink, output indexes and where the
        sink's replies go); return what some sink will never take.

        With ``release`` (the batch sends nothing more), the batch's turn at each ordered sink
        is given up as soon as it is done with that sink, so a sink that is down does not hold
        back the next batches' sends to the others.

        Raises:
            SourceStalledError: a sink kept failing for ``give_up_s`` (after the other sinks
                finished).
        """
        if release and turn is not None:
            replied = {t for r in self.routing.routes for t in r.replies.values()}
            for name in self.routing.ordered - set(by_sink) - replied:
                turn.release_one(name)  # nothing for it in this batch
        jobs = [
            self._to_sink(
                name,
                [(outputs[i], then) for i, then in items],
                [i for i, _ in items],
                seq,
                _Releasing(turn) if release and turn is not None else turn,
            )
            for name, items in by_sink.items()
        ]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        failures: list[SinkFailure] = []
        error: BaseException | None = None
        for result in results:
            if isinstance(result, BaseException):
                error = error or result
            else:
                failures.extend(result)
        if error is not None:
            raise error
        return failures

    async def _to_sink(
        self,
        name: str,
        items: list[tuple[Keyed, str | None]],
        origins: list[int],
        seq: int,
        turn: Turn | _Releasing | None,
    ) -> list[SinkFailure]:
        sink = self.routing.sinks[name]
        if turn is not None:
            await turn.wait(name)
        keyed = [k for k, _ in items]
        thens = [t for _, t in items]
        if self._routed and getattr(getattr(sink, "config", None), "mode", None) == "structured":
            # a replica encodes outputs for Kafka in binary mode (source_placement: actor):
            # decoded back for a sink that writes structured events
            keyed = [(as_event(e), k) if isinstance(e, KafkaRecord) else (e, k) for e, k in keyed]
        keys: list[str | None] = []
        dedupe = self._dedupe
        if dedupe is not None and keyed:
            raw = [dedupe_key(o) for o, _ in keyed]
            if self._routed:  # each (event, sink) pair is deduplicated on its own
                raw = [None if k is None else f"{name}\x00{k}" for k in raw]
            keys = dedupe.digests(raw)
            seen = await dedupe.claim(keys, sink)
            injected_fault(self._pipeline, "after-claim")
            if any(seen):
                self._stats["duplicates"] += sum(seen)
                keep = [j for j, s in enumerate(seen) if not s]
                keyed = [keyed[j] for j in keep]
                thens = [thens[j] for j in keep]
                origins = [origins[j] for j in keep]
                keys = [keys[j] for j in keep]
        what = "sink" if not self._routed else f"sink {name!r}"
        refusals: dict[int, dict[str, Any]] = {}
        unencodable = await send_bounded(
            sink, keyed, what, seq, self._policy, self._pipeline, refusals
        )
        if dedupe is not None and keys:
            # A process killed before this mark leaves the outputs pending: the next owner
            # of the batch searches the sink for them (see _delivery).
            injected_fault(self._pipeline, "after-sink-ack")
            await dedupe.mark([k for j, k in enumerate(keys) if j not in unencodable], hashed=True)
        self._stats["outputs"] += len(keyed) - len(unencodable)
        failures = self._refused(name, unencodable, refusals, origins)
        failures += await self._replies(sink, name, keyed, thens, origins, unencodable, seq, turn)
        if isinstance(turn, _Releasing):
            turn.turn.release_one(name)
        return failures

    def _refused(
        self,
        name: str,
        unencodable: dict[int, tuple[str, str]],
        refusals: dict[int, dict[str, Any]],
        origins: list[int],
    ) -> list[SinkFailure]:
        failures = []
        for j, (error_type, message) in unencodable.items():
            if error_type == "RecordTooLargeError":
                self._stats["too_large"] += 1
            attributes = dict(refusals.get(j) or {})
            if self._routed:
                attributes["ebsink"] = name
            failures.append(
                SinkFailure(origins[j], Failure("sink", error_type, message), attributes)
            )
        return failures

    async def _replies(
        self,
        sink: Any,
        name: str,
        keyed: list[Keyed],
        thens: list[str | None],
        origins: list[int],
        unencodable: dict[int, tuple[str, str]],
        seq: int,
        turn: Turn | _Releasing | None,
    ) -> list[SinkFailure]:
        """Send the replies of a ``reply: true`` sink on to the next sinks of their routes."""
        failures: list[SinkFailure] = []
        take = getattr(sink, "take_replies", None)
        if take is None:
            return failures
        replies = take([e for e, _ in keyed])  # popped for every event sent, wanted or not
        onward: dict[str, tuple[list[tuple[Keyed, str | None]], list[int]]] = {}
        for j, then in enumerate(thens):
            reply = replies[j]
            if then is None or reply is None or j in unencodable:
                continue
            if isinstance(reply, Exception):  # a reply that cannot be used: say so
                attributes = {"ebsink": name} if self._routed else {}
                failure = Failure("sink", type(reply).__name__, str(reply))
                failures.append(SinkFailure(origins[j], failure, attributes))
                continue
            nxt = onward.setdefault(then, ([], []))
            nxt[0].append(((reply, keyed[j][1]), self.routing.reply_route(name, then)))
            nxt[1].append(origins[j])
        for then, (more, more_origins) in onward.items():
            failures += await self._to_sink(then, more, more_origins, seq, turn)
        return failures
