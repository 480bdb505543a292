"""Routing of output events to named sinks, and the per-sink turns that keep batch order.

A :class:`Routing` holds the named sinks and the routes over them. :meth:`Routing.plan` says,
per output event, which sinks get it (every route whose predicate holds; the default route
when none did), and where each sink's replies go (the next sink of the route, after an HTTP
sink with ``reply: true``).

:class:`Turns` keep batch order at a sink: a batch's first send to an ordered sink waits until
the previous batch is done with that sink; other sinks do not wait, so a sink that is down
holds back only its own deliveries (and the commit), never the other sinks' sends.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eventbus.eventing._codecs import KafkaRecord, decode_kafka
from eventbus.eventing._event import CloudEvent

__all__ = ["Route", "RouteError", "Routing", "Turns", "as_event"]

Predicate = Callable[[CloudEvent], bool]


@dataclass(frozen=True, slots=True)
class Route:
    """One route.

    Args:
        name: for messages and dead letters (``routes[0]``).
        sinks: the sinks the event goes to, in YAML order (replies included, see ``replies``).
        when: the predicate; None for the default route.
        ordered: keep batch order at these sinks.
        replies: per sink with ``reply: true``, the sink its replies go to (that sink gets only
            replies from this route, not the event).
    """

    name: str
    sinks: tuple[str, ...]
    when: Predicate | None = None
    ordered: bool = False
    replies: Mapping[str, str] = field(default_factory=dict)

    @property
    def targets(self) -> tuple[str, ...]:
        """The sinks that get the event itself (not the replies of another)."""
        reply_targets = set(self.replies.values())
        return tuple(s for s in self.sinks if s not in reply_targets)


class RouteError(Exception):
    """A route's predicate failed on an event (a CEL error): its input is dead-lettered."""

    def __init__(self, route: str, message: str) -> None:
        super().__init__(route, message)
        self.route = route
        self.message = message

    def __str__(self) -> str:
        return f"{self.route}.when: {self.message}"


@dataclass(frozen=True, slots=True)
class Plan:
    """Where each output goes: per sink, ``(output index, the sink its replies go to)``."""

    by_sink: dict[str, list[tuple[int, str | None]]]
    unrouted: list[int]  # outputs no route took (no default route)
    errors: dict[int, RouteError]


class Routing:
    """Named sinks and the routes over them.

    Args:
        sinks: the sinks by name.
        routes: the routes, in YAML order (the default route, if any, last).

    Example:
        >>> r = Routing({"a": sink_a, "b": sink_b},
        ...             [Route("routes[0]", ("a",), when=lambda e: e.type == "x"),
        ...              Route("routes[1]", ("b",))])        # doctest: +SKIP
    """

    def __init__(self, sinks: Mapping[str, Any], routes: Sequence[Route]) -> None:
        self.sinks = dict(sinks)
        self.routes = tuple(routes)
        self.ordered = frozenset(s for r in self.routes if r.ordered for s in r.sinks)
        self._needs_event = any(r.when is not None for r in self.routes)

    def plan(self, outputs: Sequence[CloudEvent | KafkaRecord]) -> Plan:
        """Route every output (see the module docstring)."""
        by_sink: dict[str, list[tuple[int, str | None]]] = {}
        unrouted: list[int] = []
        errors: dict[int, RouteError] = {}
        for i, out in enumerate(outputs):
            event = as_event(out) if self._needs_event else None
            taken: dict[str, str | None] = {}
            matched = False
            for route in self.routes:
                if route.when is None:
                    if matched:
                        continue
                else:
                    try:
                        if not route.when(event):  # type: ignore[arg-type]
                            continue
                    except Exception as e:  # noqa: BLE001 - dead-lettered, per event
                        errors[i] = RouteError(route.name, f"{type(e).__name__}: {e}")
                        break
                    matched = True
                for sink in route.targets:
                    taken.setdefault(sink, route.replies.get(sink))
            if i in errors:
                continue
            if not taken:
                unrouted.append(i)
            for sink, then in taken.items():
                by_sink.setdefault(sink, []).append((i, then))
        return Plan(by_sink, unrouted, errors)

    def reply_route(self, sink: str, then: str) -> str | None:
        """Where the replies of ``then`` go when it got replies of ``sink`` (a chain)."""
        for route in self.routes:
            if route.replies.get(sink) == then:
                return route.replies.get(then)
        return None


def as_event(item: CloudEvent | KafkaRecord) -> CloudEvent:
    """An output as a CloudEvent (a replica may have encoded it for Kafka already)."""
    if isinstance(item, KafkaRecord):
        return decode_kafka(
            item.value,
            item.headers,
            key=item.key,
            topic="",
            partition=0,
            offset=0,
            default_type="eventbus.record",
            default_source="eventbus",
        )
    return item


class Turns:
    """Batch order at ordered sinks (see the module docstring).

    :meth:`reserve` is called in batch order (when a batch is made); it returns the batch's
    :class:`Turn`, whose :meth:`Turn.wait` returns once the previous batch released the sink.
    """

    def __init__(self, ordered: frozenset[str]) -> None:
        self.ordered = ordered
        self._tails: dict[str, asyncio.Future[None]] = {}

    def reserve(self) -> Turn:
        loop = asyncio.get_running_loop()
        turn = Turn()
        for sink in self.ordered:
            prev = self._tails.get(sink)
            own: asyncio.Future[None] = loop.create_future()
            own.add_done_callback(_retrieve)
            turn.slots[sink] = (prev, own)
            self._tails[sink] = own
        return turn


class Turn:
    """One batch's place in line at each ordered sink."""

    def __init__(self) -> None:
        self.slots: dict[str, tuple[asyncio.Future[None] | None, asyncio.Future[None]]] = {}

    async def wait(self, sink: str) -> None:
        """Return once the previous batch is done with ``sink`` (at once for unordered sinks).

        Raises:
            Exception: the previous batch failed at this sink (the source stops; what was
                not committed is consumed again, in order).
        """
        slot = self.slots.get(sink)
        if slot is None or slot[0] is None:
            return
        prev = slot[0]
        await asyncio.shield(prev)

    def release_one(self, sink: str) -> None:
        """This batch is done with ``sink`` (the next batch may send there once the ones
        before this one are done too)."""
        slot = self.slots.get(sink)
        if slot is not None:
            self._release(*slot, None)

    def release(self, error: BaseException | None = None) -> None:
        """This batch is done with every sink (``error``: it failed there, and so do the
        batches after it)."""
        for prev, own in self.slots.values():
            self._release(prev, own, error)

    @staticmethod
    def _release(
        prev: asyncio.Future[None] | None, own: asyncio.Future[None], error: BaseException | None
    ) -> None:
        if not own.done():
            if isinstance(error, asyncio.CancelledError):
                own.cancel()
            elif error is not None:
                own.set_exception(error)
            elif prev is None:
                own.set_result(None)
            elif prev.done():
                _chain(prev, own)
            else:  # done before the previous batch: released when that one is
                prev.add_done_callback(functools.partial(_chain, own=own))


def _chain(prev: asyncio.Future[None], own: asyncio.Future[None]) -> None:
    if own.done():
        return
    if prev.cancelled():
        own.cancel()
        return
    error = prev.exception()
    if error is not None:
        own.set_exception(error)
    else:
        own.set_result(None)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # marks it retrieved: a failure is reported by the batch that had it
