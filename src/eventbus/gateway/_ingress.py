"""What the gateway does with a request, whatever its transport (HTTP or gRPC).

A :class:`RouteTable` maps pipelines (and HTTP paths) to their ``http``/``grpc`` source
settings; :class:`Ingress` authenticates, decodes and validates a request's events and hands
them to an :class:`IngressBackend`: ``publish`` (durable: the pipeline's ingress topic, acked)
or ``invoke`` (run through the pipeline, outputs back). The backend is the only part that
knows Kafka and Ray Serve, so the rest is tested with a plain in-process backend.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from eventbus.errors import EventDecodeError, IngressError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._http_codec import decode_http
from eventbus.eventing._outcome import Failure, Outcome
from eventbus.gateway._auth import MemoryReplayCache, ReplayCache, authenticate
from eventbus.gateway._routes import Route, RouteTable

__all__ = [
    "COLD_START_RETRY_S",
    "MAX_ATTRIBUTE_CHARS",
    "MAX_BATCH_EVENTS",
    "Ingress",
    "IngressBackend",
    "split_outcomes",
]

log = logging.getLogger("eventbus.gateway")

#: Longest string value of one context attribute (id, source, type, extensions...) the
#: gateway takes (400 above): attributes travel in headers (binary mode, Kafka records, sync
#: replies), where large values cost every hop; data has no such limit.
MAX_ATTRIBUTE_CHARS = 1024
#: Most events of one batch-mode request or ``Publish`` call (400 above): decoding holds the
#: gateway's loop, ~2 us an event.
MAX_BATCH_EVENTS = 10_000
#: The ``Retry-After`` of a sync call that a pipeline at zero could not answer in time: a
#: replica's start plus a consumer-group join, with margin.
COLD_START_RETRY_S = 5.0


class IngressBackend(Protocol):
    """Where accepted events go."""

    async def publish(self, pipeline: str, events: list[CloudEvent]) -> None:
        """Write the events durably (the pipeline's ingress topic); return once acked."""

    async def invoke(self, pipeline: str, events: list[CloudEvent]) -> list[Outcome]:
        """Run the events through the pipeline; one outcome per event."""


def _pointer(path: Iterable[Any]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


class Ingress:
    """Transport-independent request handling.

    Args:
        backend: where events go.
        routes: the route table (replace :attr:`routes` to update it).
        refresh: called on a miss (an unknown pipeline or path); True when it changed the
            routes, so the lookup is tried once more.
    """

    def __init__(
        self,
        backend: IngressBackend,
        routes: RouteTable | None = None,
        refresh: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.backend = backend
        self.routes = routes or RouteTable()
        self.refresh = refresh
        #: signatures seen within their replay window (a gateway sets a Redis one)
        self.replay: ReplayCache = MemoryReplayCache()
        #: pipelines whose replicas are scaled to zero now, and those that may be
        #: (``replicas.min: 0``); a gateway keeps them current
        self.scaled_to_zero: frozenset[str] = frozenset()
        self.may_scale_to_zero: frozenset[str] = frozenset()
        #: records a sync call of a ``min: 0`` pipeline (activity; wakes it at zero)
        self.wake: Callable[[str], Awaitable[None]] | None = None

    async def route(self, kind: str, key: str) -> Route:
        """The route of a pipeline (``kind`` http or grpc) or of an HTTP ``path``.

        Raises:
            IngressError: 404 naming the pipeline or path.
        """
        for attempt in (0, 1):
            table = self.routes
            try:
                if kind == "http":
                    return table.http_route(key)
                if kind == "grpc":
                    return table.grpc_route(key)
                return table.path_route(key)
            except IngressError:
                if attempt or self.refresh is None or not await self.refresh():
                    raise
        raise AssertionError("unreachable")

    async def authenticate(
        self,
        route: Route,
        headers: Mapping[str, str],
        body: bytes,
        *,
        method: str = "POST",
        path: str = "/",
        query: str = "",
    ) -> None:
        """401/403 unless the request carries the route's credentials, 401 for a signed
        request seen before (a replay), 503 when the route's secret could not be loaded (the
        caller is not told which variable or file: the gateway's log is)."""
        if route.problem is not None:
            raise IngressError(
                503,
                f"pipeline {route.pipeline!r} is not accepting {route.kind} events: its auth "
                "secret is not configured on the gateway (the gateway's log says what is missing: "
                "`eventbus logs gateway`)",
            )
        replay = authenticate(
            route.credentials,
            headers,
            body,
            self.routes.token_owners,
            method=method,
            path=path,
            query=query,
        )
        if replay is None:
            return
        try:
            first = await self.replay.claim(replay)
        except Exception as e:  # noqa: BLE001 - fail closed: a replay must not pass
            log.warning("replay check of pipeline %r failed: %s", route.pipeline, e)
            raise IngressError(
                503,
                f"pipeline {route.pipeline!r}: the gateway cannot check signed requests for "
                "replays right now (its Redis did not answer); nothing was accepted, retry",
            ) from None
        if not first:
            raise IngressError(
                401,
                f"this signed request to pipeline {route.pipeline!r} was replayed: each "
                "signature is accepted once; sign every request anew",
            )

    def decode(
        self, route: Route, headers: Mapping[str, str], body: bytes
    ) -> tuple[list[CloudEvent], str]:
        """Decode an HTTP body (400 naming the attribute) and validate the data (422)."""
        try:
            events, mode = decode_http(
                headers,
                body,
                default_type=route.config.type,
                default_source=route.default_source,
                max_events=MAX_BATCH_EVENTS,
                max_attribute_chars=MAX_ATTRIBUTE_CHARS,
            )
        except EventDecodeError as e:
            raise IngressError(400, str(e)) from None
        if not events:
            raise IngressError(400, "the batch is empty; send at least one event")
        self.validate(route, events)
        return events, mode

    def validate(self, route: Route, events: list[CloudEvent]) -> None:
        """422 naming the event and the JSON pointer of the first schema violation."""
        validator = route.validator
        if validator is None:
            return
        from jsonschema.exceptions import best_match

        for i, e in enumerate(events):
            err = best_match(validator.iter_errors(e.data))
            if err is not None:
                where = (
                    f"event {i} (id {e.attributes.get('id')!r})"
                    if len(events) > 1
                    else f"event id {e.attributes.get('id')!r}"
                )
                pointer = _pointer(err.absolute_path) or "/"
                raise IngressError(
                    422,
                    f"{where}: data fails the data_schema of pipeline {route.pipeline!r} at JSON "
                    f"pointer {pointer}: {err.message}",
                )

    async def publish(self, route: Route, events: list[CloudEvent]) -> None:
        """Durably accept events (503 when the broker does not ack)."""
        try:
            await self.backend.publish(route.pipeline, events)
        except IngressError:
            raise
        except Exception as e:  # noqa: BLE001 - the caller must retry; nothing was acknowledged
            log.warning("publish to pipeline %r failed: %s", route.pipeline, e)
            raise IngressError(
                503,
                f"pipeline {route.pipeline!r}: the events could not be written to its ingress topic ({type(e).__name__}: {e}); nothing was accepted, retry",
            ) from None

    async def invoke(
        self, route: Route, events: list[CloudEvent], deadline_s: float | None = None
    ) -> list[Outcome]:
        """Run events through the pipeline within the route's ``timeout_ms``, or the caller's
        own deadline when that is sooner (a gRPC call's): 504 after it, or 503 with
        ``Retry-After`` when the pipeline was scaled to zero and its cold start did not end
        in time (the call woke it: a retry after that finds it up)."""
        timeout_s = route.config.timeout_ms / 1000.0
        within = f"{route.config.timeout_ms} ms (timeout_ms of its source)"
        if deadline_s is not None and deadline_s < timeout_s:
            timeout_s = max(0.0, deadline_s)
            within = f"the call's deadline ({timeout_s * 1000:.0f} ms were left)"
        cold = route.pipeline in self.scaled_to_zero
        if self.wake is not None and route.pipeline in self.may_scale_to_zero | self.scaled_to_zero:
            try:
                await self.wake(route.pipeline)
            except Exception as e:  # noqa: BLE001 - the call itself may still be served
                log.warning("recording a call of pipeline %r failed: %s", route.pipeline, e)
        try:
            return await asyncio.wait_for(self.backend.invoke(route.pipeline, events), timeout_s)
        except TimeoutError:
            if cold:
                raise IngressError(
                    503,
                    f"pipeline {route.pipeline!r} was scaled to zero (replicas.min: 0) and is "
                    f"starting; it did not answer within {within}; retry after Retry-After, or "
                    "send async (nothing waits then)",
                    retry_after_s=COLD_START_RETRY_S,
                ) from None
            fix = "raise timeout_ms" if deadline_s is None else "give the call a longer deadline"
            raise IngressError(
                504,
                f"pipeline {route.pipeline!r} did not answer within {within}; retry, or {fix}",
            ) from None
        except IngressError:
            raise
        except Exception as e:  # noqa: BLE001
            log.warning("invoke of pipeline %r failed: %s", route.pipeline, e)
            raise IngressError(
                503,
                f"pipeline {route.pipeline!r} could not run the events ({type(e).__name__}: {e}); retry",
            ) from None


def split_outcomes(
    pipeline: str, events: list[CloudEvent], outcomes: list[Outcome]
) -> list[CloudEvent]:
    """The output events of a sync call.

    Raises:
        IngressError: 422 listing each failed event with its step and error.
    """
    outputs: list[CloudEvent] = []
    failures = []
    for e, o in zip(events, outcomes):
        if isinstance(o, Failure):
            failures.append(
                f"event {e.attributes.get('id')!r} failed in step {o.step!r}: {o.error_type}: {o.message}"
            )
        else:
            outputs.extend(o)
    if failures:
        raise IngressError(
            422,
            f"pipeline {pipeline!r}: "
            + "; ".join(failures[:10])
            + (f" (and {len(failures) - 10} more)" if len(failures) > 10 else ""),
        )
    return outputs
