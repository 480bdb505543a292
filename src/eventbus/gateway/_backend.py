"""The gateway's backend: Kafka producers and Ray Serve calls behind the ingress.

Async requests are micro-batched into one produce to the pipeline's ingress topic and
answered once the broker acked (several producers, each with a batch in flight); sync requests
are micro-batched into one ``DeploymentHandle`` call to the pipeline's Serve application, by
value over the replica's gRPC server.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from eventbus._internal.backoff import Backoff
from eventbus.errors import IngressError
from eventbus.eventing._codecs import KafkaRecord, encode_kafka_binary
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing._outcome import Outcome
from eventbus.eventing.sinks._base import SinkEncodeError
from eventbus.eventing.sources._http_config import GATEWAY_PRODUCERS, ingress_topic
from eventbus.gateway._batcher import MicroBatcher

__all__ = ["GatewayBackend"]

log = logging.getLogger("eventbus.gateway")

#: Most bytes of one ingress record, headers, key and value together (413 above). The
#: producer refuses a record over its max_request_size (1 MiB) and Kafka's default
#: message.max.bytes is about 1 MiB; 32 KiB are left for the record and batch framing.
MAX_RECORD_BYTES = 1024 * 1024 - 32 * 1024
# Framing of one record in a batch (length, attributes, deltas; varints), at most.
_RECORD_OVERHEAD = 64
#: A pipeline scaled to zero has no Serve application (the controller deleted it): a sync
#: call waits this long at most for the wake-up to run it again (the caller's own deadline,
#: shorter, cancels the wait first), looking again every _APP_POLL_S.
APP_WAIT_S = 60.0
_APP_POLL_S = 0.05
#: Tries of a pipeline call that raised (a replica died, say) and the pauses between them.
_CALL_TRIES = 3
_CALL_BACKOFF = Backoff(initial_s=0.2, max_s=0.4)
_HEADER_OVERHEAD = 10


def _to_record(e: CloudEvent) -> KafkaRecord:
    # The whole record is measured before it joins a produce: one that the producer or the
    # broker would refuse must not fail the requests batched with it.
    headers, value = encode_kafka_binary(e)
    pkey = e.attributes.get("partitionkey")
    key = None if pkey is None else (pkey.encode() if isinstance(pkey, str) else str(pkey).encode())
    size = _RECORD_OVERHEAD + (len(value) if value is not None else 0) + (len(key) if key else 0)
    for name, raw in headers:
        size += len(name) + len(raw) + _HEADER_OVERHEAD
    if size > MAX_RECORD_BYTES:
        vsize = len(value) if value is not None else 0
        msg = (
            f"event {e.attributes.get('id')!r} is {size} bytes as a Kafka record (data "
            f"{vsize}, attributes and key {size - vsize}); a record may have at most "
            f"{MAX_RECORD_BYTES}: send large payloads by reference (a URL in data)"
        )
        raise IngressError(413, msg)
    return KafkaRecord(headers, value, key)


def _too_large(exc: BaseException) -> bool:
    # aiokafka's MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError and
    # the sinks' own, by name: the broker's limit may be below MAX_RECORD_BYTES.
    return type(exc).__name__.endswith("TooLargeError")


async def _send_apart(sink: Any, records: list[KafkaRecord]) -> list[str | None]:
    """Send records; a record refused as such fails alone. Per record: None when acked, or
    why it was refused.

    Raises:
        Exception: anything else (nothing is known to be acknowledged: the requests retry).
    """
    try:
        await sink.send([(r, None) for r in records])
        return [None] * len(records)
    except SinkEncodeError as e:  # refused before anything was sent
        failed = e.failures
        rest = [r for i, r in enumerate(records) if i not in failed]
        if rest:
            await sink.send([(r, None) for r in rest])
        return [
            f"{failed[i][0]}: {failed[i][1]}" if i in failed else None for i in range(len(records))
        ]
    except Exception as e:
        if len(records) == 1 or not _too_large(e):
            raise
        log.warning(
            "a produce of %d records was refused as too large; sending them one by one",
            len(records),
        )
    # Rare (a broker limit below ours): each record alone, to find the one refused. A record
    # of a batch the broker had acknowledged is written twice; dedupe (source + id) drops it.
    out: list[str | None] = []
    for r in records:
        try:
            await sink.send([(r, None)])
            out.append(None)
        except Exception as one:
            if not _too_large(one):
                raise
            out.append(f"{type(one).__name__}: {one}")
    return out


class GatewayBackend:
    """Kafka and Ray Serve behind the gateway, with one micro-batcher per pipeline and way.

    Args:
        kafka_bootstrap: the broker of the ingress topics.
        max_batch: most events per produce or Ray call.
        linger_ms: wait for more requests before a batch goes (0: next loop turn).
        producers: Kafka producers per pipeline, each with its own connection and a batch
            in flight (aiokafka sends one produce request per connection at a time).
        invoke_in_flight: concurrent Serve calls per pipeline (sync requests).
        make_sink: ``(topic, lane)`` to a started-on-``start()`` sink with ``send`` and
            ``stop`` (tests); None: a :class:`~eventbus.eventing.sinks.KafkaSink`.
        kafka_client: the broker's connection settings (TLS, SASL); None: plaintext.
    """

    def __init__(
        self,
        kafka_bootstrap: str,
        *,
        max_batch: int = 2000,
        linger_ms: float = 0.0,
        producers: int = GATEWAY_PRODUCERS,
        invoke_in_flight: int = 4,
        make_sink: Callable[[str, tuple[int, int]], Any] | None = None,
        kafka_client: KafkaClientConfig | None = None,
    ) -> None:
        if producers < 1 or invoke_in_flight < 1:
            msg = f"producers={producers}, invoke_in_flight={invoke_in_flight}: both must be >= 1"
            raise ValueError(msg)
        self.kafka_bootstrap = kafka_bootstrap
        self.kafka_client = kafka_client
        self._producers = producers
        self._invoke_in_flight = invoke_in_flight
        self._max_batch = max_batch
        self._linger_ms = linger_ms
        self._make_sink = make_sink
        self._publishers: dict[str, MicroBatcher[KafkaRecord, str | None]] = {}
        self._sinks: dict[str, list[Any]] = {}
        self._invokers: dict[str, MicroBatcher[CloudEvent, Outcome]] = {}
        self._lock = asyncio.Lock()
        #: counts each batch run synchronously (:class:`GatewayMetrics`); set by the Gateway
        self.figures: Any = None
        #: the pipelines with ``replicas.min: 0``, whose application may be away (at zero): a
        #: call waits for it to come back instead of failing; set by the Gateway
        self.may_scale_to_zero: frozenset[str] = frozenset()
        #: pipeline -> the shared host that runs it (``serving.host``)
        self.hosted: dict[str, str] = {}

    async def publish(self, pipeline: str, events: list[CloudEvent]) -> None:
        """Write the events to the pipeline's ingress topic; returns once acked."""
        records = [_to_record(e) for e in events]
        batcher = self._publishers.get(pipeline)
        if batcher is None:
            batcher = await self._publisher(pipeline)
        results = await batcher.submit(records)
        refused = [(e, why) for e, why in zip(events, results) if why is not None]
        if refused:
            e, why = refused[0]
            taken = len(events) - len(refused)
            msg = (
                f"pipeline {pipeline!r}: event {e.attributes.get('id')!r} was refused by the "
                f"broker ({why}); {len(refused)} of the request's {len(events)} events were "
                f"refused, {taken} accepted: send large payloads by reference (a URL in data)"
            )
            raise IngressError(413, msg)

    def _new_sink(self, topic: str, lane: tuple[int, int]) -> Any:
        if self._make_sink is not None:
            return self._make_sink(topic, lane)
        from eventbus.eventing.sinks._kafka import KafkaSink, KafkaSinkConfig

        return KafkaSink(
            KafkaSinkConfig(topic=topic),
            bootstrap_servers=self.kafka_bootstrap,
            lane=lane,
            client=self.kafka_client,
        )

    async def _publisher(self, pipeline: str) -> MicroBatcher[KafkaRecord, str | None]:
        async with self._lock:
            if pipeline not in self._publishers:
                # Several producers, each with its own connection: aiokafka sends one produce
                # request per broker connection at a time, so with one producer concurrent
                # requests wait a whole round trip for each other. Each writes its own lane of
                # partitions, so no two write one partition with keyless records.
                n = self._producers
                sinks = [self._new_sink(ingress_topic(pipeline), (i, n)) for i in range(n)]
                try:
                    for sink in sinks:
                        await sink.start()
                except BaseException:
                    for sink in sinks:
                        await sink.stop()
                    raise
                idle = collections.deque(sinks)

                async def flush(records: list[KafkaRecord]) -> list[str | None]:
                    sink = idle.popleft()  # the batcher runs at most len(sinks) flushes at once
                    try:
                        return await _send_apart(sink, records)
                    finally:
                        idle.append(sink)

                self._sinks[pipeline] = sinks
                self._publishers[pipeline] = MicroBatcher(
                    flush, max_size=self._max_batch, linger_ms=self._linger_ms, max_in_flight=n
                )
        return self._publishers[pipeline]

    async def invoke(self, pipeline: str, events: list[CloudEvent]) -> list[Outcome]:
        """Run the events through the pipeline's Serve application (one call per batch)."""
        batcher = self._invokers.get(pipeline)
        if batcher is None:
            batcher = await self._invoker(pipeline)
        return await batcher.submit(events)

    async def _invoker(self, pipeline: str) -> MicroBatcher[CloudEvent, Outcome]:
        handle = await self._handle(pipeline)  # not under the lock: it may wait for a wake-up
        async with self._lock:
            if pipeline not in self._invokers:

                async def flush(events: list[CloudEvent]) -> list[Outcome]:
                    nonlocal handle
                    attempt = 0
                    loop = asyncio.get_running_loop()
                    away_until = loop.time() + APP_WAIT_S
                    while True:
                        try:
                            outcomes: list[Outcome] = await handle.process.remote(events)
                            if self.figures is not None:
                                self.figures.ran(pipeline, outcomes)
                            return outcomes
                        except Exception as e:
                            if (
                                _app_away(e)
                                and pipeline in self.may_scale_to_zero
                                and loop.time() < away_until
                            ):  # scaled to zero meanwhile: wait for the application
                                await asyncio.sleep(_APP_POLL_S)
                                handle = await self._handle(pipeline)
                                continue
                            attempt += 1
                            if attempt == _CALL_TRIES:
                                raise
                            log.warning("pipeline %r: call failed (%s); retrying", pipeline, e)
                            await asyncio.sleep(_CALL_BACKOFF.delay(attempt))

                self._invokers[pipeline] = MicroBatcher(
                    flush,
                    max_size=self._max_batch,
                    linger_ms=self._linger_ms,
                    max_in_flight=self._invoke_in_flight,
                )
        return self._invokers[pipeline]

    async def _handle(self, pipeline: str) -> Any:
        """A handle of the pipeline's Serve application; for a ``min: 0`` pipeline whose
        application is away (at zero, deleted) it waits up to :data:`APP_WAIT_S` for the
        wake-up to run it again.

        Raises:
            IngressError: 503, the application is not running (and does not come back).
        """
        from eventbus.serving._deployment import app_name
        from eventbus.serving._host import MemberHandle, host_app_name
        from eventbus.serving._ray_adapter import by_value

        loop = asyncio.get_running_loop()
        away_until = loop.time() + APP_WAIT_S
        host = self.hosted.get(pipeline)
        while True:
            try:
                handle = await asyncio.to_thread(
                    _app_handle, app_name(pipeline) if host is None else host_app_name(host)
                )
            except IngressError:
                if pipeline not in self.may_scale_to_zero or loop.time() >= away_until:
                    raise
                await asyncio.sleep(_APP_POLL_S)
                continue
            # By value over the replica's gRPC server, not through the object store:
            # one round trip instead of a put, a call and a get (~1.6x the req/s here).
            handle = by_value(handle)
            return handle if host is None else MemberHandle(handle, pipeline)

    def forget(self, pipelines: set[str]) -> None:
        """Drop the batchers of pipelines no longer deployed (their sinks close in the background)."""
        for name in list(self._invokers):
            if name not in pipelines:
                del self._invokers[name]
        for name in list(self._publishers):
            if name not in pipelines:
                del self._publishers[name]
                for sink in self._sinks.pop(name):
                    asyncio.get_running_loop().create_task(sink.stop())

    async def close(self) -> None:
        """Flush what is in flight and close the producers."""
        for publisher in self._publishers.values():
            await publisher.close()
        for invoker in self._invokers.values():
            await invoker.close()
        for sinks in self._sinks.values():
            for sink in sinks:
                await sink.stop()

    def stats(self) -> dict[str, Any]:
        """Each pipeline's batchers' flushes and items so far (``publish`` and ``invoke``)."""
        return {
            "publish": {k: b.stats() for k, b in self._publishers.items()},
            "invoke": {k: b.stats() for k, b in self._invokers.items()},
        }


def _app_away(exc: BaseException) -> bool:
    """Whether a handle call failed because its application is gone (deleted at zero)."""
    from ray.serve.exceptions import DeploymentUnavailableError

    return isinstance(exc, DeploymentUnavailableError)


def _app_handle(name: str) -> Any:
    from ray import serve

    try:
        return serve.get_app_handle(name)
    except Exception as e:  # noqa: BLE001
        msg = (
            f"the Serve application {name!r} is not running ({e}); check `eventbus list`, and "
            f"`eventbus logs {name.removeprefix('eventbus-')}` for its replicas' log"
        )
        raise IngressError(503, msg) from None
