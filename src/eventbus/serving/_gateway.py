"""The gateway process: HTTP (uvicorn + FastAPI) and gRPC (grpc.aio) in front of the pipelines.

``eventbus gateway`` (started by ``eventbus up``; one per node of a cluster) serves both on
one event loop. Routes come from the pipelines the controller keeps in Redis (re-read every
half second, and at once on a miss). Async requests are micro-batched into one produce to the
pipeline's ingress topic and answered once the broker acked (several producers, each with a
batch in flight); sync requests are micro-batched into one ``DeploymentHandle`` call to the
pipeline's Serve application, by value over the replica's gRPC server.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from eventbus._internal.batcher import MicroBatcher
from eventbus.errors import IngressError
from eventbus.eventing._codecs import KafkaRecord, encode_kafka_binary
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.eventing.sources._ingress import Ingress, RouteTable

__all__ = ["Gateway", "GatewayBackend", "run_gateway"]

log = logging.getLogger("eventbus.gateway")

_PIPELINES_KEY = "eventbus:pipelines"
_REFRESH_S = 0.5
_MAX_RECORD = 1024 * 1024 - 32 * 1024
#: Kafka producers per pipeline; ingress topics have at least as many partitions, so that each
#: producer writes partitions of its own (measured: 4 -> 8 gave ~+5-15% async req/s at -c16)
GATEWAY_PRODUCERS = 8


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
        self._opts = {"max_size": max_batch, "linger_ms": linger_ms}
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
        from eventbus.eventing.sources._http_config import ingress_topic

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
                    flush, **dict(self._opts, max_in_flight=n)
                )  # type: ignore[arg-type]
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

                opts = dict(self._opts, max_in_flight=self._invoke_in_flight)
                self._invokers[pipeline] = MicroBatcher(flush, **opts)  # type: ignore[arg-type]
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
        for b in (*self._publishers.values(), *self._invokers.values()):
            await b.close()
        for sinks in self._sinks.values():
            for sink in sinks:
                await sink.stop()

    def stats(self) -> dict[str, Any]:
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


class Gateway:
    """Routes from Redis, HTTP and gRPC servers, the backend.

    Args:
        kafka_bootstrap: the broker.
        redis_url: where the controller keeps the pipelines.
        host: the interface to listen on.
        http_port: HTTP port (0: a free one).
        grpc_port: gRPC port (0: a free one; None: no gRPC).
        environ: where auth secrets are read from (default ``os.environ``).
    """

    def __init__(
        self,
        kafka_bootstrap: str,
        redis_url: str,
        *,
        host: str = "127.0.0.1",
        http_port: int = 8080,
        grpc_port: int | None = 50051,
        environ: dict[str, str] | None = None,
        backend: Any = None,
    ) -> None:
        self.redis_url = redis_url
        self.host = host
        self.http_port = http_port
        self.grpc_port = grpc_port
        self._environ = environ
        self.backend = backend or GatewayBackend(kafka_bootstrap)
        self.ingress = Ingress(self.backend)
        self._raw: dict[str, str] | None = None
        self._redis: Any = None
        self._last_refresh = 0.0
        self._refreshing: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        from eventbus.observability._metrics import GatewayMetrics

        self.figures = GatewayMetrics()
        if isinstance(self.backend, GatewayBackend):
            self.backend.figures = self.figures

    async def refresh(self) -> None:
        """Re-read the pipelines from Redis; rebuild the routes when they changed."""
        self._last_refresh = time.monotonic()
        raw: dict[str, str] = await self._redis.hgetall(_PIPELINES_KEY)
        if raw == self._raw:
            return
        self._raw = raw
        docs = [json.loads(v)["document"] for v in raw.values()]
        table = await asyncio.to_thread(RouteTable.from_documents, docs, self._environ)
        self.ingress.routes = table
        if isinstance(self.backend, GatewayBackend):
            self.backend.forget(set(table.pipelines))
        self.figures.forget(set(table.pipelines))

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_REFRESH_S)
            try:
                await self.refresh()
            except Exception as e:  # noqa: BLE001 - keep serving the last routes
                log.warning("reading pipelines from Redis failed: %s", e)

    async def refresh_on_miss(self) -> bool:
        """Refresh now (one Redis read shared by the misses that arrive while it runs);
        True: look the route up again. Never skipped for a recent refresh: a pipeline
        deployed just after the last one must be found."""
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.create_task(self.refresh())
        try:
            await asyncio.shield(task)
        except Exception as e:  # noqa: BLE001 - answer from the routes we have
            log.warning("reading pipelines from Redis failed: %s", e)
        return True

    async def _publish_figures(self, field: str, final: bool = False) -> None:
        """Write this gateway's sync counts per pipeline to ``eventbus:stats:<pipeline>``
        (role ``gateway``): every gateway's, so any gateway or ``eventbus status`` shows
        totals that include the sync calls."""
        from eventbus.serving._figures import write_entry

        live = self.ingress.routes.pipelines
        for pipeline, counts in list(self.figures.sync.items()):
            if pipeline in live:  # a deleted pipeline's hash is gone: do not write it again
                await write_entry(
                    self._redis, pipeline, field, {"role": "gateway", "sync": dict(counts)}, final
                )

    async def _publish_forever(self, field: str) -> None:
        from eventbus.serving._figures import PUBLISH_EVERY_S

        while True:
            await asyncio.sleep(PUBLISH_EVERY_S)
            try:
                await self._publish_figures(field)
            except Exception as e:  # noqa: BLE001 - figures are best effort
                log.debug("publishing the gateway's figures failed: %s", e)

    def stop(self) -> None:
        """Ask the servers to stop (they finish the requests in flight)."""
        self._stop.set()

    async def serve(self, on_ready: Callable[[Gateway], None] | None = None) -> None:
        """Serve until :meth:`stop` (or SIGTERM/SIGINT when run by :func:`run_gateway`)."""
        import redis.asyncio as aioredis
        import uvicorn

        from eventbus.eventing.sources._grpc import build_grpc_server
        from eventbus.eventing.sources._http import build_http_app

        self._redis = aioredis.Redis.from_url(self.redis_url, decode_responses=True)
        await self.refresh()
        self.ingress.refresh = self.refresh_on_miss
        from eventbus.observability._observer import Observer

        app = build_http_app(self.ingress, observer=Observer(self._redis, self.figures))
        from eventbus.serving._admin import add_admin_routes, admin_token_from

        add_admin_routes(
            app, admin_token_from(self._environ if self._environ is not None else os.environ)
        )
        config = uvicorn.Config(
            app,
            host=self.host,
            port=self.http_port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http="httptools",
            loop="none",
            timeout_graceful_shutdown=10,
        )
        server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        grpc_server = None
        if self.grpc_port is not None:
            grpc_server, self.grpc_port = build_grpc_server(
                self.ingress, f"{self.host}:{self.grpc_port}"
            )
            await grpc_server.start()
        http_task = asyncio.create_task(server.serve())
        while not server.started:
            if http_task.done():
                await http_task
                msg = f"the gateway's HTTP server did not start on {self.host}:{self.http_port}"
                raise RuntimeError(msg)
            await asyncio.sleep(0.01)
        if self.http_port == 0:
            self.http_port = server.servers[0].sockets[0].getsockname()[1]
        watcher = asyncio.create_task(self._watch())
        from eventbus.serving._figures import entry_id

        figures_field = entry_id("gateway")
        publisher = asyncio.create_task(self._publish_forever(figures_field))
        self.ready.set()
        if on_ready is not None:
            on_ready(self)
        try:
            await self._stop.wait()
        finally:
            server.should_exit = True
            await http_task
            if grpc_server is not None:
                await grpc_server.stop(5)
            watcher.cancel()
            await self.backend.close()
            publisher.cancel()
            try:
                await self._publish_figures(figures_field, final=True)
            except Exception as e:  # noqa: BLE001 - figures are best effort
                log.warning("writing the gateway's final figures failed: %s", e)
            await self._redis.aclose()


def run_gateway(
    kafka_bootstrap: str,
    redis_url: str,
    *,
    ray_address: str | None,
    host: str,
    http_port: int,
    grpc_port: int | None,
    on_ready: Callable[[Gateway], None] | None = None,
    otlp_endpoint: str | None = None,
    trace_sample_ratio: float = 1.0,
    log_format: str = "text",
) -> None:
    """Run a gateway in this process until SIGTERM or SIGINT (the ``eventbus gateway`` command).

    Connects to Ray (for sync calls) when ``ray_address`` is given or Ray is reachable.
    With ``otlp_endpoint``, traces each event (``traceparent``) and exports over OTLP/HTTP;
    ``log_format="json"`` writes the ``eventbus`` logs as JSON lines.
    """
    import uvloop

    if log_format == "json":
        from eventbus.observability._logging import configure_json_logging

        configure_json_logging({"component": "gateway"})
    if otlp_endpoint:
        from eventbus.observability._tracing import configure_tracing

        configure_tracing(
            otlp_endpoint=otlp_endpoint,
            sample_ratio=trace_sample_ratio,
            service_name="eventbus-gateway",
        )

    if ray_address is not None:
        import ray

        from eventbus.serving._controller import NAMESPACE

        if not ray.is_initialized():
            ray.init(
                address=ray_address,
                namespace=NAMESPACE,
                logging_level="WARNING",
                log_to_driver=False,
            )

    async def main() -> None:
        gateway = Gateway(
            kafka_bootstrap,
            redis_url,
            host=host,
            http_port=http_port,
            grpc_port=grpc_port,
            environ=dict(os.environ),
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, gateway.stop)
        await gateway.serve(on_ready)

    try:
        uvloop.run(main())
    finally:
        if otlp_endpoint:
            from eventbus.observability._tracing import shutdown_tracing

            shutdown_tracing()  # flush the spans still batched
