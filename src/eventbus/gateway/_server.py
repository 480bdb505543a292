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
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

from eventbus._internal import keys
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.gateway._backend import GatewayBackend
from eventbus.gateway._ingress import Ingress
from eventbus.gateway._routes import RouteTable

__all__ = ["Gateway", "run_gateway"]

log = logging.getLogger("eventbus.gateway")

_REFRESH_S = 0.5
#: Every pipeline's record is read when the pipelines' version changed (the controller's
#: deploys and deletes increment it), and at least this often (a version key lost or never
#: written: an older controller).
_REREAD_S = 30.0


class Gateway:
    """Routes from Redis, HTTP and gRPC servers, the backend.

    Args:
        kafka_bootstrap: the broker.
        redis_url: where the controller keeps the pipelines.
        host: the interface to listen on.
        http_port: HTTP port (0: a free one).
        grpc_port: gRPC port (0: a free one; None: no gRPC).
        environ: where auth secrets, the admin token and the read token are read from
            (default ``os.environ``).
        allowed_origins: origins (``https://shop.example``) whose web pages may send
            state-changing requests besides the gateway's own (see ``gateway._guard``).
        kafka_client: the broker's connection settings (TLS, SASL); None: plaintext.
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
        allowed_origins: Iterable[str] = (),
        kafka_client: KafkaClientConfig | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.host = host
        self.http_port = http_port
        self.grpc_port = grpc_port
        self._environ = environ
        self.allowed_origins = tuple(allowed_origins)
        self._kafka_bootstrap = kafka_bootstrap
        self._kafka_client = kafka_client
        self.backend = backend or GatewayBackend(kafka_bootstrap, kafka_client=kafka_client)
        self.ingress = Ingress(self.backend)
        self._raw: dict[str, str] | None = None
        self._version: str | None = None  # keys.PIPELINES_VERSION at the last full read
        self._read_at = float("-inf")  # when (monotonic)
        self._redis: Any = None
        self._last_refresh = 0.0
        self._refreshing: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        from eventbus.gateway._secrets import GatewaySecrets

        self.secrets = GatewaySecrets(environ if environ is not None else os.environ)
        from eventbus.observability._metrics import GatewayMetrics

        self.figures = GatewayMetrics()
        from eventbus.serving._figures import ChangeGate

        self._figures_gate = ChangeGate()  # unchanged sync counts: written at the heartbeat
        self._history: dict[str, Any] = {}  # pipeline -> its HistoryRecorder
        self._woken: dict[str, float] = {}  # pipeline -> when a sync call was last recorded
        self.ingress.wake = self._wake
        if isinstance(self.backend, GatewayBackend):
            self.backend.figures = self.figures

    async def refresh(self) -> None:
        """Re-read the pipelines from Redis; rebuild the routes when they changed."""
        now = self._last_refresh = time.monotonic()
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(keys.PIPELINES_VERSION)
            pipe.hkeys(keys.SCALED_TO_ZERO)
            pipe.get(keys.SECRETS_VERSION)
            version, zero, secrets_version = await pipe.execute()
        self.ingress.scaled_to_zero = frozenset(zero)
        # a new or rotated secret: the routes are resolved again (no restart)
        rotated = await self.secrets.update(self._redis, secrets_version)
        fresh = version is not None and version == self._version and now - self._read_at < _REREAD_S
        if fresh and not rotated:
            return  # no pipeline changed since the last read (the version is read first)
        raw: dict[str, str] = await self._redis.hgetall(keys.PIPELINES)
        self._version, self._read_at = version, now
        if raw == self._raw and not rotated:
            return
        self._raw = raw
        docs = [json.loads(v)["document"] for v in raw.values()]
        self.ingress.may_scale_to_zero = frozenset(
            d["metadata"]["name"] for d in docs if _min_replicas(d) == 0
        )
        table = await asyncio.to_thread(
            RouteTable.from_documents, docs, self._environ, self.secrets.values
        )
        self.ingress.routes = table
        if isinstance(self.backend, GatewayBackend):
            self.backend.may_scale_to_zero = self.ingress.may_scale_to_zero
            self.backend.hosted = {
                d["metadata"]["name"]: d["spec"]["serving"]["host"]
                for d in docs
                if d["spec"].get("serving", {}).get("host")
            }
            self.backend.forget(set(table.pipelines))
        self.figures.forget(set(table.pipelines))
        for gone in set(self._history) - set(table.pipelines):
            del self._history[gone]  # a pipeline deployed again under the name starts anew

    async def _wake(self, pipeline: str) -> None:
        """Record a sync call of a ``min: 0`` pipeline for the controller's scale-to-zero
        watcher (at most once a second per pipeline)."""
        now = time.monotonic()
        if now - self._woken.get(pipeline, -1.0) < 1.0:
            return
        self._woken[pipeline] = now
        await self._redis.hset(keys.WAKE, pipeline, str(time.time()))

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
        """Write this gateway's sync counts per pipeline to ``eventbus:stats:{<pipeline>}``
        (role ``gateway``): every gateway's, so any gateway or ``eventbus status`` shows
        totals that include the sync calls."""
        from eventbus.observability._history import HistoryRecorder
        from eventbus.serving._figures import write_entry

        gate = self._figures_gate
        live = self.ingress.routes.pipelines
        for pipeline, counts in list(self.figures.sync.items()):
            # a deleted pipeline's hash is gone: do not write it again; unchanged counts are
            # written at the heartbeat only (no per-second work per idle pipeline)
            if pipeline in live and (final or gate.due(pipeline, dict(counts))):
                history = self._history.get(pipeline)
                if history is None:
                    history = self._history[pipeline] = HistoryRecorder(pipeline, field)
                body = {"role": "gateway", "sync": dict(counts)}
                await write_entry(self._redis, pipeline, field, body, final, history=history)

    async def _publish_forever(self, field: str) -> None:
        from eventbus.serving._figures import PUBLISH_EVERY_S

        while True:
            await asyncio.sleep(PUBLISH_EVERY_S)
            try:
                await self._publish_figures(field)
                await self.secrets.publish_env(self._redis, field)
            except Exception as e:  # noqa: BLE001 - figures are best effort
                log.debug("publishing the gateway's figures failed: %s", e)

    def stop(self) -> None:
        """Ask the servers to stop (they finish the requests in flight)."""
        self._stop.set()

    async def serve(self, on_ready: Callable[[Gateway], None] | None = None) -> None:
        """Serve until :meth:`stop` (or SIGTERM/SIGINT when run by :func:`run_gateway`)."""
        import uvicorn

        from eventbus._internal.redis_client import connect_async
        from eventbus.gateway._admin import add_admin_routes, admin_token_from, read_token_from
        from eventbus.gateway._auth import RedisReplayCache
        from eventbus.gateway._grpc import build_grpc_server
        from eventbus.gateway._guard import guard
        from eventbus.gateway._http import build_http_app
        from eventbus.gateway._observer import Observer
        from eventbus.gateway._protocol import GatewayHttpProtocol

        self._redis = connect_async(self.redis_url, decode_responses=True)
        from eventbus._internal.secret_store import configure as configure_secrets

        configure_secrets(self.redis_url)  # {secret: NAME} of the Kafka client settings
        # signed requests are accepted once, across every gateway of the cluster
        self.ingress.replay = RedisReplayCache(self._redis)
        await self.refresh()
        self.ingress.refresh = self.refresh_on_miss
        app = build_http_app(self.ingress, observer=Observer(self._redis, self.figures))
        environ = self._environ if self._environ is not None else os.environ
        admin_token = admin_token_from(environ)
        add_admin_routes(app, admin_token)
        read_token = read_token_from(environ)
        from eventbus.gateway._registry import RegistryMount

        # the schema registry under /registry (eventbus.schemas), its topic read on first use
        self.registry = RegistryMount(
            app, self._kafka_bootstrap, self._kafka_client, write_token=admin_token
        )
        front = guard(
            self.registry,
            read_tokens=[t for t in (read_token, admin_token) if t] if read_token else (),
            allowed_origins=self.allowed_origins,
        )
        config = uvicorn.Config(
            front,
            host=self.host,
            port=self.http_port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http=GatewayHttpProtocol,  # httptools, with the head bounded in bytes and time
            loop="none",
            timeout_graceful_shutdown=10,
        )
        # uvicorn (>= 0.29) installs its SIGTERM/SIGINT handlers only while serve() runs and
        # raises a captured signal again once it returns; the loop's handlers of run_gateway
        # still see the signal, so either way the gateway stops cleanly through stop().
        server = uvicorn.Server(config)
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
        await self.secrets.publish_env(self._redis, figures_field)  # before ready: deploys see it
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
            await self.registry.close()
            await self.backend.close()
            publisher.cancel()
            try:
                await self._publish_figures(figures_field, final=True)
                await self.secrets.forget_env(self._redis, figures_field)
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
    allowed_origins: Iterable[str] = (),
    kafka_client: KafkaClientConfig | None = None,
) -> None:
    """Run a gateway in this process until SIGTERM or SIGINT (the ``eventbus gateway`` command).

    Connects to Ray (for sync calls) when ``ray_address`` is given or Ray is reachable.
    With ``otlp_endpoint``, traces each event (``traceparent``) and exports over OTLP/HTTP;
    ``log_format="json"`` writes the ``eventbus`` logs as JSON lines. ``allowed_origins``:
    web pages of these origins may POST besides the gateway's own (others get 403).
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
                logging_level=logging.WARNING,
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
            allowed_origins=allowed_origins,
            kafka_client=kafka_client,
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


def _min_replicas(document: dict[str, Any]) -> int:
    """``spec.serving.replicas``'s lower bound in a pipeline document (defaults left out)."""
    replicas = document.get("spec", {}).get("serving", {}).get("replicas", 1)
    return int(replicas.get("min", 1) if isinstance(replicas, dict) else replicas)
