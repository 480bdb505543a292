"""Delivery of the Kafka source: outputs to the sinks, failures to the dead-letter sink, dedupe.

With routes, each output goes to the sinks its routes name, each (output, sink) pair claimed,
sent, retried and marked on its own (``_kafka_fanout``); an output no route takes is counted in
``unrouted``; one whose route predicate fails dead-letters its input with ``ebstep`` naming
the route. Dead letters of outputs a named sink refused carry ``ebsink``.

:meth:`Delivery.send` takes some settled events of a batch and returns once the sink and the
dead-letter sink acknowledged everything it sent (a send that is not acknowledged is retried
for at most ``give_up_s``, then the source stops: see ``_kafka_errors``). With dedupe, outputs
are claimed before the send and marked done after the ack. An output the sink cannot encode,
or refuses as too large, dead-letters its input with ``ebstep: sink``; a dead letter the
dead-letter sink refuses goes again truncated (``ebtruncated``, ``ebsize``).

Dead-letter events are the original input event plus the extension attributes ``ebpipeline``,
``ebstep``, ``eberrortype``, ``eberror``, ``ebattempts``, ``ebtopic``, ``ebpartition`` and
``eboffset`` (:func:`dead_letter_event`); a record that did not decode becomes an event of type
:data:`DECODE_ERROR_TYPE` with the raw value as its data (:meth:`Delivery.undecodable`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, cast

from eventbus.errors import EventDecodeError
from eventbus.eventing._codecs import RawRecord, decode_kafka_records
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.eventing._routing import Route, Routing, Turn, Turns
from eventbus.eventing.sinks._base import Sink
from eventbus.eventing.sources._kafka_batch import KafkaBatch, Keyed
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.eventing.sources._kafka_dead import (
    TRUNCATED_DATA_BYTES,
    dead_letter_event,
    truncated_dead_letter,
)
from eventbus.eventing.sources._kafka_fanout import SINGLE, FanOut
from eventbus.eventing.sources._kafka_retry import Settled
from eventbus.eventing.sources._kafka_send import send_bounded
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy, SourceSinks

__all__ = [
    "DECODE_ERROR_TYPE",
    "TRUNCATED_DATA_BYTES",
    "Delivery",
    "dead_letter_event",
    "truncated_dead_letter",
]

# One logger for every part of the Kafka source, as when it was one module.
log = logging.getLogger("eventbus.eventing.sources._kafka")

#: ``type`` of the dead-letter event made from a record that could not be decoded.
DECODE_ERROR_TYPE = "eventbus.decode_error"


class Delivery:
    """Sends a source's outputs and dead letters, with dedupe, until the sinks acknowledge.

    Args:
        config: the source configuration (``type``/``source`` of plain messages).
        pipeline: the pipeline name (``ebpipeline``, logs, fault injection).
        sinks: the sink and the dead-letter sink.
        policy: dedupe and the backoff of unacknowledged sends.
        stats: the source's counters (decode_errors, outputs, dropped, failed, dead_lettered,
            duplicates are counted here).
    """

    def __init__(
        self,
        config: KafkaSourceConfig,
        pipeline: str,
        sinks: SourceSinks,
        policy: DeliveryPolicy,
        stats: dict[str, int],
    ) -> None:
        self._config = config
        self._pipeline = pipeline
        routing = sinks.routing
        if routing is None:  # one sink for every output, in batch order
            routing = Routing({SINGLE: sinks.sink}, [Route(SINGLE, (SINGLE,), ordered=True)])
        self._fanout = FanOut(routing, sinks.routing is not None, pipeline, policy, stats)
        self._turns = Turns(routing.ordered)
        self._dead_letter = sinks.dead_letter
        self._dedupe = policy.dedupe
        self._policy = policy
        self._stats = stats

    def reserve(self) -> Turn:
        """A new batch's place in line at the ordered sinks; call it in batch order."""
        return self._turns.reserve()

    async def start(self) -> None:
        """Start the sinks."""
        for sink in self._fanout.routing.sinks.values():
            await sink.start()
        if self._dead_letter is not None:
            await self._dead_letter.start()

    async def stop_sinks(self) -> None:
        """Stop the sinks."""
        for sink in self._fanout.routing.sinks.values():
            await sink.stop()
        if self._dead_letter is not None:
            await self._dead_letter.stop()

    async def close(self) -> None:
        """Stop the sinks and close the dedupe store."""
        await self.stop_sinks()
        if self._dedupe is not None:
            await self._dedupe.close()

    def undecodable(self, record: Any, error: EventDecodeError) -> Keyed:
        """Count and log a record that did not decode; return its dead-letter event (the raw
        value as data, the error in the ``eb*`` attributes) with its key."""
        self._stats["decode_errors"] += 1
        log.warning(
            "kafka source %s: undecodable record %s[%d]@%d: %s",
            self._pipeline,
            record.topic,
            record.partition,
            record.offset,
            error,
            extra={"pipeline": self._pipeline, "step": "decode"},
        )
        attrs: dict[str, Any] = {
            "specversion": "1.0",
            "id": f"{record.topic}-{record.partition}-{record.offset}",
            "source": self._config.source or f"kafka://{record.topic}",
            "type": DECODE_ERROR_TYPE,
        }
        value = record.value
        if value is not None:
            attrs["datacontenttype"] = "application/octet-stream"
        attrs.update(
            ebpipeline=self._pipeline,
            ebstep="decode",
            eberrortype=type(error).__name__,
            eberror=str(error),
            ebattempts=1,
            ebtopic=record.topic,
            ebpartition=record.partition,
            eboffset=record.offset,
        )
        return CloudEvent(attrs, None if value is None else bytes(value)), record.key

    async def send(
        self,
        batch: KafkaBatch,
        items: Settled,
        dead: list[Keyed],
        turn: Turn | None = None,
        last: bool = False,
    ) -> None:
        """Send the outputs and dead letters of some events of a batch; wait for the acks.

        Args:
            batch: the batch.
            items: settled events of it: (index, outcome, tries).
            dead: dead letters to send along (the batch's undecodable records); more are
                appended.
            turn: the batch's place in line at the ordered sinks (:meth:`reserve`).
            last: the batch sends nothing more after this (no events left to retry): its turn
                at each sink is given up as soon as it is done there.
        """
        outputs: list[Keyed] = []
        origins: list[int] = []  # per output: the index of its input event
        dropped = failed = 0
        for i, outcome, attempts in items:
            if isinstance(outcome, Failure):
                if outcome.step == "decode" and type(batch.events[i]) is RawRecord:
                    # Decoded where dispatch ran, and it did not decode there.
                    error = EventDecodeError(outcome.message)
                    dead.append(self.undecodable(batch.records[i], error))
                    continue
                failed += 1
                if attempts > 1:  # dispatched again by the retry policy: count every try
                    outcome = Failure(
                        outcome.step,
                        outcome.error_type,
                        outcome.message,
                        outcome.attempts + attempts - 1,
                    )
                self._dead_letter_failure(batch, i, outcome, dead)
            elif outcome:
                key = batch.records[i].key
                for out in outcome:
                    outputs.append((out, key))
                    origins.append(i)
            else:
                dropped += 1
        plan = self._fanout.routing.plan([o for o, _ in outputs])
        for j, route_error in plan.errors.items():  # a route's predicate failed on the output
            failed += 1
            failure = Failure(route_error.route, "RouteError", str(route_error))
            self._dead_letter_failure(batch, origins[j], failure, dead)
        if plan.unrouted:
            # No route took them and there is no default route: counted, never silent.
            self._stats["unrouted"] += len(plan.unrouted)
            log.info(
                "kafka source %s: %d outputs of batch %d matched no route (no default route); "
                "counted in unrouted",
                self._pipeline,
                len(plan.unrouted),
                batch.seq,
            )
        dead_task = asyncio.ensure_future(self._send_dead(dead, batch.seq))
        try:
            refused = await self._fanout.send(outputs, plan.by_sink, batch.seq, turn, last)
        finally:
            dead_lettered = await dead_task
        if refused:
            # Outputs a sink cannot encode, finds too large or refuses for good will never go
            # through: dead-letter their inputs (once per sink), and the batch commits past them.
            more: list[Keyed] = []
            for r in refused:
                failed += 1
                self._dead_letter_failure(
                    batch, origins[r.origin], r.failure, more, r.attributes or None
                )
            dead_lettered += await self._send_dead(more, batch.seq)
        self._stats["dead_lettered"] += dead_lettered
        self._stats["dropped"] += dropped
        self._stats["failed"] += failed

    def _dead_letter_failure(
        self,
        batch: KafkaBatch,
        i: int,
        failure: Failure,
        dead: list[Keyed],
        attributes: dict[str, Any] | None = None,
    ) -> None:
        record = batch.records[i]
        topic, partition, offset = record.topic, record.partition, record.offset
        event = batch.events[i]
        if type(event) is RawRecord:  # decoded on the replica: decode this one again here
            events, errors = decode_kafka_records(
                [record], default_type=self._config.type, default_source=self._config.source
            )
            if errors:
                raise errors[0][1]
            original = events[0]
        else:
            original = cast(CloudEvent, event)
        event_id = original.attributes.get("id")
        extra = {"pipeline": self._pipeline, "step": failure.step, "event_id": event_id}
        if self._dead_letter is None:
            log.error(
                "kafka source %s: event %s from %s[%d]@%d failed in step %r: %s: %s "
                "(no dead_letter sink configured; the event is dropped)",
                self._pipeline,
                event_id,
                topic,
                partition,
                offset,
                failure.step,
                failure.error_type,
                failure.message,
                extra=extra,
            )
            return
        # Failures are rare: one line per dead-lettered event (none per delivered one).
        log.warning(
            "kafka source %s: event %s from %s[%d]@%d failed in step %r (%s: %s): dead-lettered",
            self._pipeline,
            event_id,
            topic,
            partition,
            offset,
            failure.step,
            failure.error_type,
            failure.message,
            extra=extra,
        )
        letter = dead_letter_event(original, self._pipeline, failure, topic, partition, offset)
        if attributes:  # what the sink's destination answered (ebhttpstatus, ebhttpbody)
            letter = letter.replace(**attributes)
        dead.append((letter, record.key))

    async def _send_dead(self, dead: list[Keyed], seq: int) -> int:
        """Send dead letters; one the sink refuses (too large, unencodable) goes again
        truncated (:func:`truncated_dead_letter`). Returns how many were written."""
        sink = self._dead_letter
        if sink is None or not dead:
            return 0
        refused = await self._send_with_retry(sink, dead, "dead_letter", seq)
        if not refused:
            return len(dead)
        cut = [(truncated_dead_letter(dead[j][0], p), dead[j][1]) for j, p in refused.items()]
        lost = await self._send_with_retry(sink, cut, "dead_letter", seq)
        self._stats["dead_letters_truncated"] += len(cut) - len(lost)
        if lost:
            self._stats["dead_letters_lost"] += len(lost)
            for j, (error_type, message) in lost.items():
                event = cut[j][0]
                log.error(
                    "kafka source %s: the dead letter of event %s (%s[%s]@%s) was refused by "
                    "the dead-letter sink even truncated (%s: %s); it is counted in "
                    "dead_letters_lost and not written",
                    self._pipeline,
                    event.attributes.get("id"),
                    event.attributes.get("ebtopic"),
                    event.attributes.get("ebpartition"),
                    event.attributes.get("eboffset"),
                    error_type,
                    message,
                )
        return len(dead) - len(lost)

    async def _send_with_retry(
        self, sink: Sink | None, items: Sequence[Keyed], what: str, seq: int
    ) -> dict[int, tuple[str, str]]:
        return await send_bounded(sink, items, what, seq, self._policy, self._pipeline)
