"""Sending to a sink until it acknowledges, within bounds (see ``_kafka_errors``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from eventbus.eventing.sinks._base import (
    Sink,
    SinkEncodeError,
    SinkPartialError,
    SinkTooLargeError,
)
from eventbus.eventing.sources._kafka_batch import Keyed
from eventbus.eventing.sources._kafka_errors import SourceStalledError
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy

__all__ = ["send_bounded"]

# One logger for every part of the Kafka source, as when it was one module.
log = logging.getLogger("eventbus.eventing.sources._kafka")


async def send_bounded(
    sink: Sink | None,
    items: Sequence[Keyed],
    what: str,
    seq: int,
    policy: DeliveryPolicy,
    pipeline: str,
    attributes: dict[int, dict[str, Any]] | None = None,
) -> dict[int, tuple[str, str]]:
    """Send until acknowledged; return the items the sink cannot encode, refuses as too
    large (never sent) or refuses for good (an HTTP 4xx: see :class:`SinkPartialError`, whose
    dead-letter extension attributes go into ``attributes`` by item index).

    A sink answering per item (:class:`SinkPartialError`) gets only its pending items again,
    after the backoff with jitter or its ``Retry-After``, whichever is longer; the give-up
    clock restarts whenever such a send made progress.

    Raises:
        SourceStalledError: the sink kept failing otherwise for ``give_up_s``.
    """
    if sink is None or not items:
        return {}
    attempt = 0
    first_failure: float | None = None
    unencodable: dict[int, tuple[str, str]] = {}
    index = list(range(len(items)))  # position in ``items`` of each item still to send
    while True:
        try:
            await sink.send(items)
            return unencodable
        except asyncio.CancelledError:
            raise
        except SinkEncodeError as e:
            log.error("kafka source %s: %s: %s", pipeline, what, e)
            for i, problem in e.failures.items():
                unencodable[index[i]] = problem
            keep = [i for i in range(len(items)) if i not in e.failures]
            items = [items[i] for i in keep]
            index = [index[i] for i in keep]
            if not items:
                return unencodable
        except SinkTooLargeError as e:
            if len(items) == 1:
                unencodable[index[0]] = ("RecordTooLargeError", str(e))
                return unencodable
            # Which item is too large is not known: send halves until it is alone.
            log.warning(
                "kafka source %s: %s: %s; sending batch %d's %d events in halves",
                pipeline,
                what,
                e,
                seq,
                len(items),
            )
            half = len(items) // 2
            for part, positions in ((items[:half], index[:half]), (items[half:], index[half:])):
                more: dict[int, dict[str, Any]] = {}
                refused = await send_bounded(sink, part, what, seq, policy, pipeline, more)
                for j, problem in refused.items():
                    unencodable[positions[j]] = problem
                if attributes is not None:
                    attributes.update((positions[j], a) for j, a in more.items())
            return unencodable
        except SinkPartialError as e:
            for i, problem in e.refused.items():
                unencodable[index[i]] = problem
                if attributes is not None and i in e.attributes:
                    attributes[index[i]] = dict(e.attributes[i])
            if len(e.pending) < len(items):  # progress: the budget restarts
                attempt, first_failure = 0, None
            items = [items[i] for i in e.pending]
            index = [index[i] for i in e.pending]
            if not items:
                return unencodable
            attempt += 1
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if now - first_failure >= policy.give_up_s:
                raise SourceStalledError(pipeline, what, now - first_failure, str(e)) from e
            delay = max(policy.backoff_s(attempt), e.retry_after_s or 0.0)
            log.warning(
                "kafka source %s: %s: %s (batch %d, attempt %d); retrying in %.2f s",
                pipeline,
                what,
                e,
                seq,
                attempt,
                delay,
            )
            await asyncio.sleep(delay)
        except Exception as e:
            if policy.exactly_once:  # the transaction is broken: it aborts, the batch comes again
                raise
            attempt += 1
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if now - first_failure >= policy.give_up_s:
                last = f"{type(e).__name__}: {e}"
                raise SourceStalledError(pipeline, what, now - first_failure, last) from e
            delay = policy.backoff_s(attempt)
            log.warning(
                "kafka source %s: %s did not acknowledge batch %d (%d events, attempt %d): "
                "%s: %s; retrying in %.2f s",
                pipeline,
                what,
                seq,
                len(items),
                attempt,
                type(e).__name__,
                e,
                delay,
            )
            await asyncio.sleep(delay)
