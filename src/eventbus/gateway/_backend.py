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
from typing import Any

from eventbus.errors import IngressError
from eventbus.eventing._codecs import KafkaRecord, encode_kafka_binary
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.eventing.sources._http_config import GATEWAY_PRODUCERS, ingress_topic
from eventbus.gateway._batcher import MicroBatcher

__all__ = ["GatewayBackend"]

log = logging.getLogger("eventbus.gateway")

_MAX_RECORD = 1024 * 1024 - 32 * 1024


def _to_record(e: CloudEvent) -> KafkaRecord:
    headers, value = encode_kafka_binary(e)
    if value is not None and len(value) > _MAX_RECORD:
        raise IngressError(
            413,
            f"event {e.attributes.get('id')!r} is {len(value)} bytes encoded; a record may have at most {_MAX_RECORD}: send large payloads by reference",
        )
    pkey = e.attributes.get("partitionkey")
    key = None if pkey is None else (pkey.encode() if isinstance(pkey, str) else str(pkey).encode())
    return KafkaRecord(headers, value, key)


class GatewayBackend:
    """Kafka and Ray Serve behind the gateway, with one micro-batcher per pipeline and way.

    Args:
        kafka_bootstrap: the broker of the ingress topics.
        max_batch: most events per produce or Ray call.
        linger_ms: wait for more requests before a batch goes (0: next loop turn).
        producers: Kafka producers per pipeline, each with its own connection and a batch
            in flight (aiokafka sends one produce request per connection at a time).
        invoke_in_flight: concurrent Serve calls per pipeline (sync requests).
    """

    def __init__(
        self,
        kafka_bootstrap: str,
        *,
        max_batch: int = 2000,
        linger_ms: float = 0.0,
        producers: int = GATEWAY_PRODUCERS,
        invoke_in_flight: int = 4,
    ) -> None:
        if producers < 1 or invoke_in_flight < 1:
            msg = f"producers={producers}, invoke_in_flight={invoke_in_flight}: both must be >= 1"
            raise ValueError(msg)
        self.kafka_bootstrap = kafka_bootstrap
        self._producers = producers
        self._invoke_in_flight = invoke_in_flight
        self._max_batch = max_batch
        self._linger_ms = linger_ms
        self._publishers: dict[str, MicroBatcher[KafkaRecord, None]] = {}
        self._sinks: dict[str, list[Any]] = {}
        self._invokers: dict[str, MicroBatcher[CloudEvent, Outcome]] = {}
        self._lock = asyncio.Lock()
        #: counts each batch run synchronously (:class:`GatewayMetrics`); set by the Gateway
        self.figures: Any = None

    async def publish(self, pipeline: str, events: list[CloudEvent]) -> None:
        """Write the events to the pipeline's ingress topic; returns once acked."""
        records = [_to_record(e) for e in events]
        batcher = self._publishers.get(pipeline)
        if batcher is None:
            batcher = await self._publisher(pipeline)
        await batcher.submit(records)

    async def _publisher(self, pipeline: str) -> MicroBatcher[KafkaRecord, None]:
        from eventbus.eventing.sinks._kafka import KafkaSink, KafkaSinkConfig

        async with self._lock:
            if pipeline not in self._publishers:
                # Several producers, each with its own connection: aiokafka sends one produce
                # request per broker connection at a time, so with one producer concurrent
                # requests wait a whole round trip for each other. Each writes its own lane of
                # partitions, so no two write one partition with keyless records.
                n = self._producers
                sinks = [
                    KafkaSink(
                        KafkaSinkConfig(topic=ingress_topic(pipeline)),
                        bootstrap_servers=self.kafka_bootstrap,
                        lane=(i, n),
                    )
                    for i in range(n)
                ]
                try:
                    for sink in sinks:
                        await sink.start()
                except BaseException:
                    for sink in sinks:
                        await sink.stop()
                    raise
                idle = collections.deque(sinks)

                async def flush(records: list[KafkaRecord]) -> list[None]:
                    sink = idle.popleft()  # the batcher runs at most len(sinks) flushes at once
                    try:
                        await sink.send([(r, None) for r in records])
                    finally:
                        idle.append(sink)
                    return [None] * len(records)

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
        from eventbus.serving._deployment import app_name

        async with self._lock:
            if pipeline not in self._invokers:
                # By value over the replica's gRPC server, not through the object store:
                # one round trip instead of a put, a call and a get (~1.6x the req/s here).
                handle = (await asyncio.to_thread(_app_handle, app_name(pipeline))).options(
                    _by_reference=False
                )

                async def flush(events: list[CloudEvent]) -> list[Outcome]:
                    for attempt in range(3):
                        try:
                            outcomes: list[Outcome] = await handle.process.remote(events)
                            if self.figures is not None:
                                self.figures.ran(pipeline, outcomes)
                            return outcomes
                        except Exception as e:
                            if attempt == 2:
                                raise
                            log.warning("pipeline %r: call failed (%s); retrying", pipeline, e)
                            await asyncio.sleep(0.2 * (attempt + 1))
                    raise AssertionError("unreachable")

                self._invokers[pipeline] = MicroBatcher(
                    flush,
                    max_size=self._max_batch,
                    linger_ms=self._linger_ms,
                    max_in_flight=self._invoke_in_flight,
                )
        return self._invokers[pipeline]

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


def _app_handle(name: str) -> Any:
    from ray import serve

    try:
        return serve.get_app_handle(name)
    except Exception as e:  # noqa: BLE001
        msg = f"the Serve application {name!r} is not running ({e}); check `eventbus list`"
        raise IngressError(503, msg) from None
