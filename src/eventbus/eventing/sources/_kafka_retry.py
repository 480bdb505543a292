"""Retry scheduling of the Kafka source: dispatch calls that fail, and events that fail.

Two different things are retried:

* a dispatch call that raises: an infrastructure error (a Ray replica died, say) says nothing
  about the events: it is called again with the same batch, with capped exponential backoff,
  for at most ``give_up_s``; any other error is retried ``dispatch_retries`` times, then the
  batch is split to dead-letter the events that fail alone (:class:`Redispatcher`);
* an event that failed in a step is dispatched again alone (with the other failures of its
  batch, never with its batch-mates) after the :class:`RetryPolicy`'s backoff with jitter, up
  to its step's retries and the policy's ``max_age_s`` (:class:`EventRetries`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Iterable
from typing import Any

from eventbus.errors import EventBusError
from eventbus.eventing._delivery import RetryPolicy
from eventbus.eventing._outcome import Dispatch, Failure, Outcome
from eventbus.eventing.sources._kafka_errors import SourceStalledError, is_infrastructure
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy

__all__ = ["EarlierBatchFailedError", "EventRetries", "Redispatcher", "Settled"]

# One logger for every part of the Kafka source, as when it was one module.
log = logging.getLogger("eventbus.eventing.sources._kafka")

#: Events of a batch that are done with dispatching: (index in the batch, outcome, tries).
Settled = Iterable[tuple[int, Outcome, int]]


class Redispatcher:
    """Calls ``dispatch`` until it answers, within bounds; checks one outcome per event.

    An infrastructure error (see :mod:`._kafka_errors`) is retried with the policy's backoff
    for at most ``give_up_s``, then :class:`SourceStalledError` is raised. Any other error is
    taken as deterministic: the batch is tried ``dispatch_retries`` more times, then split in
    halves (each dispatched once, split again while it fails) until the events that fail alone
    are found; those get ``Failure(step="dispatch")`` (dead-lettered, never retried) and their
    batch-mates their real outcomes.

    Args:
        dispatch: a batch in, one outcome per event out.
        policy: the backoff between calls and the bounds above.
        pipeline: the pipeline name, for logs.
        stats: the source's counters (``dispatch_retries`` and ``poison`` are counted here).
    """

    def __init__(
        self, dispatch: Dispatch, policy: DeliveryPolicy, pipeline: str, stats: dict[str, int]
    ) -> None:
        self._dispatch = dispatch
        self._policy = policy
        self._pipeline = pipeline
        self._stats = stats
        #: in-order dispatches (:meth:`after`) that failed or wait for the batch before:
        #: the batch after one of them waits for it before its first try
        self._held: set[asyncio.Task[Any] | None] = set()

    async def __call__(self, events: list[Any], seq: int) -> list[Outcome]:
        """Dispatch ``events`` (batch ``seq``); see the class.

        A dispatch that returns the wrong number of outcomes fails every event of the batch
        with ``Failure(step="dispatch")`` (never retried).

        Raises:
            SourceStalledError: infrastructure errors went on for ``give_up_s``.
        """
        return await self._call(events, seq, self._policy.dispatch_retries)

    async def after(
        self, before: asyncio.Task[Any] | None, events: list[Any], seq: int
    ) -> list[Outcome]:
        """:meth:`__call__` in batch order (``FetchSettings.in_order``): ``before`` is the
        dispatch of the batch before (None: none). While that one is being retried (or waits
        for its own predecessor), this one's first try waits for it to get its outcomes, and
        every retry of this one does: so a dependency that comes back while the batches in
        flight sleep their backoffs sees them in order. On the happy path nothing waits (the
        batches stay pipelined); a try already running when the one before fails is not
        held back (on the source's loop, where join steps run, none is).

        Raises:
            SourceStalledError: as :meth:`__call__`.
            EarlierBatchFailedError: the batch before never got its outcomes (its source
                stops on that batch's error; this one must not change state ahead of it).
        """
        me = asyncio.current_task()
        try:
            return await self._call(events, seq, self._policy.dispatch_retries, before, me)
        finally:
            self._held.discard(me)

    async def _in_turn(
        self, before: asyncio.Task[Any], me: asyncio.Task[Any] | None, seq: int
    ) -> None:
        self._held.add(me)  # a batch after this one waits too
        await asyncio.wait((before,))
        if before.cancelled() or before.exception() is not None:
            raise EarlierBatchFailedError(self._pipeline, seq)

    async def _call(
        self,
        events: list[Any],
        seq: int,
        retries: int,
        before: asyncio.Task[Any] | None = None,
        me: asyncio.Task[Any] | None = None,
    ) -> list[Outcome]:
        attempt = 0  # failed calls of this (sub-)batch
        first_failure: float | None = None
        n = len(events)
        while True:
            if before is not None and not before.done() and (attempt or before in self._held):
                await self._in_turn(before, me, seq)
            self._held.discard(me)
            try:
                outcomes = await self._dispatch(events)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._held.add(me)  # failed: the batches after this one wait for its retry
                attempt += 1
                self._stats["dispatch_retries"] += 1
                now = time.monotonic()
                first_failure = now if first_failure is None else first_failure
                infrastructure = is_infrastructure(e)
                if infrastructure and now - first_failure >= self._policy.give_up_s:
                    last = f"{type(e).__name__}: {e}"
                    raise SourceStalledError(
                        self._pipeline, "dispatch", now - first_failure, last
                    ) from e
                if not infrastructure and attempt > retries:
                    return await self._isolate(events, seq, e, attempt)
                delay = self._policy.backoff_s(attempt)
                log.warning(
                    "kafka source %s: dispatch of batch %d (%d events) failed (attempt %d, %s): "
                    "%s: %s; retrying in %.2f s",
                    self._pipeline,
                    seq,
                    n,
                    attempt,
                    "infrastructure" if infrastructure else "not infrastructure",
                    type(e).__name__,
                    e,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            if len(outcomes) != n:
                message = (
                    f"dispatch returned {len(outcomes)} outcomes for {n} events; a dispatch "
                    "must return exactly one outcome per event, in order"
                )
                log.error("kafka source %s: %s", self._pipeline, message)
                return [Failure("dispatch", "DispatchContractError", message)] * n
            return outcomes

    async def _isolate(
        self, events: list[Any], seq: int, error: Exception, attempts: int
    ) -> list[Outcome]:
        """The batch failed ``attempts`` times the same deterministic way: find its poison."""
        if len(events) == 1:
            self._stats["poison"] += 1
            message = (
                f"{error} (dispatch raised {type(error).__name__} for this event alone "
                f"{attempts} times; it is dead-lettered and its partition moves on)"
            )
            log.error("kafka source %s: batch %d: %s", self._pipeline, seq, message)
            return [Failure("dispatch", type(error).__name__, message, attempts)]
        half = len(events) // 2
        log.warning(
            "kafka source %s: dispatch of batch %d (%d events) failed %d times (%s: %s); "
            "splitting it to find the events that fail",
            self._pipeline,
            seq,
            len(events),
            attempts,
            type(error).__name__,
            error,
        )
        # Each half is tried once more: split again if it still fails, infrastructure errors
        # retried as usual.
        first = await self._call(events[:half], seq, 0)
        return first + await self._call(events[half:], seq, 0)


class EarlierBatchFailedError(EventBusError, RuntimeError):
    """An in-order dispatch was not made: the batch before it never got its outcomes.

    Args:
        pipeline: the pipeline.
        seq: the batch not dispatched.
    """

    def __init__(self, pipeline: str, seq: int) -> None:
        super().__init__(pipeline, seq)
        self.pipeline = pipeline
        self.seq = seq

    def __str__(self) -> str:
        return (
            f"kafka source of pipeline {self.pipeline!r}: batch {self.seq} was not dispatched "
            "because the batch before it failed (steps that need their events in order); "
            "both are consumed again from the committed offsets"
        )


class EventRetries:
    """Schedules the retries of events that failed in a step, per the retry policy.

    Args:
        policy: the retry policy (None: no event is retried).
        redispatch: dispatches the events to try again.
        stats: the source's counters (``retries`` counts every event dispatched again).
    """

    def __init__(
        self, policy: RetryPolicy | None, redispatch: Redispatcher, stats: dict[str, int]
    ) -> None:
        self._policy = policy if policy is not None and policy.enabled else None
        self._redispatch = redispatch
        self._stats = stats

    def split(self, outcomes: list[Outcome]) -> tuple[Settled, list[int]]:
        """The outcomes of a batch's first dispatch: those settled now (to deliver at once),
        and the indices of the failed events that get another try."""
        policy = self._policy
        if policy is None:
            pending: list[int] = []
        else:
            pending = [
                i
                for i, o in enumerate(outcomes)
                if type(o) is Failure and policy.may_retry(o.step, 1, 0.0)
            ]
        if pending:
            skip = set(pending)
            return [(i, o, 1) for i, o in enumerate(outcomes) if i not in skip], pending
        # The usual case: no tuple list per batch (zip reuses its tuple).
        return zip(range(len(outcomes)), outcomes, itertools.repeat(1)), pending

    async def rounds(
        self, events: list[Any], pending: list[int], seq: int
    ) -> AsyncGenerator[list[tuple[int, Outcome, int]], None]:
        """Dispatch the ``pending`` events of batch ``seq`` again until each settles; yield
        what settled after each round (outputs, or a failure that is not retried again).

        The retry budget's clock (``max_age_s``) starts when this is first iterated: after
        the batch's first outcomes were delivered. A failure that ran out of time says so in
        its message.
        """
        policy = self._policy
        if policy is None or not pending:
            return
        attempt = 1
        first_failure = time.monotonic()
        while pending:
            await asyncio.sleep(policy.delay(attempt))
            attempt += 1
            self._stats["retries"] += len(pending)
            again = await self._redispatch([events[i] for i in pending], seq)
            age = time.monotonic() - first_failure
            settled: list[tuple[int, Outcome, int]] = []
            still: list[int] = []
            for i, o in zip(pending, again):
                if type(o) is Failure and policy.may_retry(o.step, attempt, age):
                    still.append(i)
                    continue
                if type(o) is Failure and policy.max_age_s is not None and age >= policy.max_age_s:
                    o = Failure(
                        o.step,
                        o.error_type,
                        f"{o.message} (gave up: max_age_s {policy.max_age_s:g} reached)",
                        o.attempts,
                    )
                settled.append((i, o, attempt))
            yield settled
            pending = still
