"""A source as a Ray actor: consumes, calls the pipeline deployment per batch, delivers.

The actor is detached and restartable: when it dies, Ray restarts it with the same
arguments and it resumes from the consumer group's committed offsets (at-least-once).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from eventbus._internal.gc import tune_gc
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing._outcome import Outcome
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._replica_sources import delivery_policy, make_sink, source_sinks

__all__ = ["SourceActor"]

log = logging.getLogger("eventbus.serving.source")


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=64)  # type: ignore[call-overload]  # max_concurrency is an actor option Ray's overloads omit
class SourceActor:
    """Runs one source of one pipeline.

    Args:
        document: the pipeline document.
        index: which entry of ``spec.sources`` this actor runs.
        app: the Serve application name to dispatch to.
        bootstrap_servers: the default Kafka bootstrap address.
        redis_url: Redis for dedupe (``delivery.dedupe``) and the source's figures
            (``eventbus:stats:<pipeline>``, role ``source``; see ``eventbus.observability``).
    """

    def __init__(
        self,
        document: dict[str, Any],
        index: int,
        app: str,
        bootstrap_servers: str,
        redis_url: str | None = None,
        kafka_client: dict[str, Any] | None = None,
    ) -> None:
        tune_gc()
        logging.basicConfig(level=logging.INFO)
        self._config = PipelineConfig.model_validate(document)
        if self._config.spec.observability.logs == "json":
            from eventbus.observability._logging import configure_json_logging

            configure_json_logging({"pipeline": self._config.name, "source": f"source-{index}"})
        self._index = index
        self._app = app
        self._bootstrap = bootstrap_servers
        self._kafka_client = (
            KafkaClientConfig.model_validate(kafka_client) if kafka_client else None
        )
        self._redis_url = redis_url
        if redis_url:  # {secret: NAME} references of the sinks resolve from the stack
            from eventbus._internal.secret_store import configure as configure_secrets

            configure_secrets(redis_url)
        self._source: Any = None
        self._redis: Any = None  # redis.asyncio client for the figures, made on first use
        self._field = ""
        self._history: Any = None  # its HistoryRecorder, made with the client
        self._error: str | None = None
        self._started = asyncio.Event()
        # An async actor's __init__ runs on its event loop. Ray restarts a dead actor by
        # re-running __init__: start consuming right away, so a restarted source resumes
        # without anyone calling ready().
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        from ray import serve

        from eventbus.eventing.sources._kafka import FetchSettings, KafkaSource

        spec = self._config.spec
        src = self._config.consumed_sources[self._index]
        handle = serve.get_app_handle(self._app)

        from eventbus.serving._wire import pack_records, unpack_encoded_outcomes

        index = self._index

        # Records cross undecoded and come back encoded: decoding and encoding run on the
        # replicas (which scale), this actor only moves bytes between Kafka and Serve.
        async def dispatch(records: list[Any]) -> list[Outcome]:
            return unpack_encoded_outcomes(
                await handle.process_records.remote(pack_records(records), index)
            )

        async def follow(step_index: int, events: list[Any]) -> list[Outcome]:
            # a timer's outputs through the steps after its own, on a replica
            outcomes: list[Outcome] = await handle.process_after.remote(step_index, events)
            return outcomes

        batch = spec.serving.batch
        self._source = KafkaSource(
            src,
            pipeline=self._config.name,
            bootstrap_servers=src.bootstrap_servers or self._bootstrap,
            client=self._kafka_client,
            dispatch=dispatch,
            sinks=source_sinks(
                self._config,
                lambda cfg: make_sink(
                    cfg, default_bootstrap=self._bootstrap, default_client=self._kafka_client
                ),
            ),
            fetch=FetchSettings(
                max_batch=batch.max_size,
                linger_ms=self._config.linger_ms_of(src),
                session_timeout_ms=src.session_timeout_ms,
                heartbeat_interval_ms=src.heartbeat_interval_ms,
                max_in_flight=batch.max_in_flight,
                decode_in_dispatch=True,
                in_order=self._config.in_order,
            ),
            delivery=delivery_policy(self._config, self._redis_url),
        )
        sweeper = None
        if self._index == 0:  # one source per pipeline closes its join windows
            from eventbus.pipelines import pipeline_timers
            from eventbus.serving._replica_sources import sweep_forever

            timers = pipeline_timers(self._config, self._redis_url)
            if timers:
                sweeper = asyncio.get_running_loop().create_task(
                    sweep_forever(
                        timers,
                        self._config,
                        self._bootstrap,
                        self._redis_url,
                        kafka_client=self._kafka_client,
                        follow=follow,
                    )
                )
        schedules_stop = asyncio.Event()
        schedules = None
        from eventbus.eventing.sources._http_config import ingress_topic

        if ingress_topic(self._config.name) in src.topics:  # it runs the schedules too
            from eventbus.serving._schedules import run_schedules

            schedules = asyncio.get_running_loop().create_task(
                run_schedules(
                    self._config,
                    bootstrap=self._bootstrap,
                    redis_url=self._redis_url,
                    stop=schedules_stop,
                    kafka_client=self._kafka_client,
                )
            )
        publisher = None
        try:  # the source starts and stops its sinks
            await self._source.start()
            self._started.set()
            if self._redis_url:
                publisher = asyncio.get_running_loop().create_task(self._publish_figures())
            await self._source.run()
        except Exception as exc:
            self._error = f"{type(exc).__name__}: {exc}"
            log.exception(
                "source %s[%d] of pipeline %r failed", "kafka", self._index, self._config.name
            )
            raise
        finally:
            schedules_stop.set()  # they give their leases back
            if schedules is not None:
                await asyncio.gather(schedules, return_exceptions=True)
            if sweeper is not None:
                sweeper.cancel()
            if publisher is not None:
                publisher.cancel()
                await asyncio.gather(publisher, return_exceptions=True)
                await self._write_figures(final=True)

    async def _publish_figures(self) -> None:
        from eventbus.serving._figures import PUBLISH_EVERY_S, ChangeGate

        gate = ChangeGate()
        while True:
            await asyncio.sleep(PUBLISH_EVERY_S)
            try:
                if gate.due("source", (self._source.stats(), self._source.lag())):
                    await self._write_figures()
            except Exception:
                log.debug("publishing figures failed", exc_info=True)

    async def _write_figures(self, final: bool = False) -> None:
        """The source's counters, latency histogram and lag, as the replicas publish theirs
        (the steps' figures come from the replicas, which run them)."""
        from eventbus._internal.redis_client import connect_async
        from eventbus.observability._history import HistoryRecorder
        from eventbus.serving._figures import entry_id, write_entry

        if self._redis is None:
            assert self._redis_url is not None  # figures are published only with a Redis
            self._redis = connect_async(self._redis_url)
            self._field = entry_id(f"source{self._index}")
            self._history = HistoryRecorder(self._config.name, self._field)
        src = self._source
        body = {
            "role": "source",
            "source_index": self._index,
            "sources": [src.stats()],
            "metrics": {"sources": [src.metrics()]},
        }
        await write_entry(
            self._redis, self._config.name, self._field, body, final, history=self._history
        )
        if final:
            await self._redis.aclose()
            self._redis = None

    async def ready(self, timeout_s: float = 60.0) -> bool:
        """Wait until the consumer has started; raise if the source failed."""
        waiter = asyncio.ensure_future(self._started.wait())
        _done, _ = await asyncio.wait(
            {waiter, self._task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        waiter.cancel()
        if self._error is not None:
            raise RuntimeError(self._error)
        return self._started.is_set()

    async def stop(self, drain: bool = True) -> None:
        """Stop consuming; with ``drain``, finish and commit the batches in flight."""
        if self._source is not None:
            await self._source.stop(drain=drain)
        try:
            await asyncio.wait_for(self._task, timeout=30)
        except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
            self._task.cancel()

    def stats(self) -> dict[str, Any]:
        """The source's counters, and its error if it failed."""
        out: dict[str, Any] = dict(self._source.stats()) if self._source is not None else {}
        if self._error:
            out["error"] = self._error
        return out
