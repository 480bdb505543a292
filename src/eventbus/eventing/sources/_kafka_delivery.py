"""Delivery of the Kafka source: outputs to the sink, failures to the dead-letter sink, dedupe.

:meth:`Delivery.send` takes some settled events of a batch and returns once the sink and the
dead-letter sink acknowledged everything it sent (a send that is not acknowledged is retried
until it is). With dedupe, outputs are claimed before the send and marked done after the ack.
An output the sink cannot encode dead-letters its input with ``ebstep: sink``.

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
from eventbus.eventing._delivery import dedupe_key, injected_fault
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.eventing.sinks._base import Sink, SinkEncodeError
from eventbus.eventing.sources._kafka_batch import KafkaBatch, Keyed
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.eventing.sources._kafka_retry import Settled
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy, SourceSinks

__all__ = ["DECODE_ERROR_TYPE", "Delivery", "dead_letter_event"]

# One logger for every part of the Kafka source, as when it was one module.
log = logging.getLogger("eventbus.eventing.sources._kafka")

#: ``type`` of the dead-letter event made from a record that could not be decoded.
DECODE_ERROR_TYPE = "eventbus.decode_error"


def dead_letter_event(
    original: CloudEvent, pipeline: str, failure: Failure, topic: str, partition: int, offset: int
) -> CloudEvent:
    """The dead-letter event of a failed input: the original plus the ``eb*`` attributes."""
    return original.replace(
        ebpipeline=pipeline,
        ebstep=failure.step,
        eberrortype=failure.error_type,
        eberror=failure.message,
        ebattempts=failure.attempts,
        ebtopic=topic,
        ebpartition=partition,
        eboffset=offset,
    )


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
        self._sink = sinks.sink
        self._dead_letter = sinks.dead_letter
        self._dedupe = policy.dedupe
        self._policy = policy
        self._stats = stats

    async def start(self) -> None:
        """Start the sinks."""
        await self._sink.start()
        if self._dead_letter is not None:
            await self._dead_letter.start()

    async def stop_sinks(self) -> None:
        """Stop the sinks."""
        await self._sink.stop()
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

    async def send(self, batch: KafkaBatch, items: Settled, dead: list[Keyed]) -> None:
        """Send the outputs and dead letters of some events of a batch; wait for the acks.

        Args:
            batch: the batch.
            items: settled events of it: (index, outcome, tries).
            dead: dead letters to send along (the batch's undecodable records); more are
                appended.
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
        keys: list[str | None] = []
        dedupe = self._dedupe
        if dedupe is not None and outputs:
            keys = dedupe.digests([dedupe_key(o) for o, _ in outputs])
            seen = await dedupe.claim(keys, self._sink)
            injected_fault(self._pipeline, "after-claim")
            if any(seen):
                self._stats["duplicates"] += sum(seen)
                keep = [j for j, s in enumerate(seen) if not s]
                outputs = [outputs[j] for j in keep]
                origins = [origins[j] for j in keep]
                keys = [keys[j] for j in keep]
        dead_task = asyncio.ensure_future(
            self._send_with_retry(self._dead_letter, dead, "dead_letter", batch.seq)
        )
        try:
            unencodable = await self._send_with_retry(self._sink, outputs, "sink", batch.seq)
            if dedupe is not None and keys:
                # A process killed before this mark leaves the outputs pending: the next owner
                # of the batch searches the sink for them (see _delivery).
                injected_fault(self._pipeline, "after-sink-ack")
                await dedupe.mark(
                    [k for j, k in enumerate(keys) if j not in unencodable], hashed=True
                )
        finally:
            dead_unencodable = await dead_task
        dead_lettered = len(dead) - len(dead_unencodable) if self._dead_letter is not None else 0
        if unencodable:
            # Outputs the sink cannot encode will never go through: dead-letter their inputs.
            more: list[Keyed] = []
            for index, (error_type, message) in unencodable.items():
                failed += 1
                failure = Failure("sink", error_type, message)
                self._dead_letter_failure(batch, origins[index], failure, more)
            lost = await self._send_with_retry(self._dead_letter, more, "dead_letter", batch.seq)
            dead_lettered += len(more) - len(lost) if self._dead_letter is not None else 0
        self._stats["outputs"] += len(outputs) - len(unencodable)
        self._stats["dead_lettered"] += dead_lettered
        self._stats["dropped"] += dropped
        self._stats["failed"] += failed

    def _dead_letter_failure(
        self, batch: KafkaBatch, i: int, failure: Failure, dead: list[Keyed]
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
        dead.append(
            (
                dead_letter_event(original, self._pipeline, failure, topic, partition, offset),
                record.key,
            )
        )

    async def _send_with_retry(
        self, sink: Sink | None, items: Sequence[Keyed], what: str, seq: int
    ) -> dict[int, tuple[str, str]]:
        """Send until acknowledged; return the items the sink cannot encode (never sent)."""
        if sink is None or not items:
            return {}
        attempt = 0
        unencodable: dict[int, tuple[str, str]] = {}
        index = list(range(len(items)))  # position in ``items`` of each item still to send
        while True:
            try:
                await sink.send(items)
                return unencodable
            except asyncio.CancelledError:
                raise
            except SinkEncodeError as e:
                log.error("kafka source %s: %s: %s", self._pipeline, what, e)
                for i, problem in e.failures.items():
                    unencodable[index[i]] = problem
                keep = [i for i in range(len(items)) if i not in e.failures]
                items = [items[i] for i in keep]
                index = [index[i] for i in keep]
                if not items:
                    return unencodable
            except Exception as e:  # noqa: BLE001 - not acknowledged: send again
                attempt += 1
                delay = self._policy.backoff_s(attempt)
                log.warning(
                    "kafka source %s: %s did not acknowledge batch %d (%d events, attempt %d): "
                    "%s: %s; retrying in %.2f s",
                    self._pipeline,
                    what,
                    seq,
                    len(items),
                    attempt,
                    type(e).__name__,
                    e,
                    delay,
                )
                await asyncio.sleep(delay)
