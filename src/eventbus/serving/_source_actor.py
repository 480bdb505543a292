"""A source as a Ray actor: consumes, calls the pipeline deployment per batch, delivers.

The actor is detached and restartable: when it dies, Ray restarts it with the same
arguments and it resumes from the consumer group's committed offsets (at-least-once).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._replica_sources import make_sink

__all__ = ["SourceActor"]

log = logging.getLogger("eventbus.serving.source")


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=64)
class SourceActor:
    """Runs one source of one pipeline.

    Args:
        document: the pipeline document.
        index: which entry of ``spec.sources`` this actor runs.
        app: the Serve application name to dispatch to.
        bootstrap_servers: the default Kafka bootstrap address.
    """

    def __init__(self, document: dict[str, Any], index: int, app: str, bootstrap_servers: str) -> None:
        _tune_gc()
        logging.basicConfig(level=logging.INFO)
        self._config = PipelineConfig.model_validate(document)
        self._index = index
        self._app = app
        self._bootstrap = bootstrap_servers
        self._source: Any = None
        self._task: asyncio.Task[None] | None = None
        self._error: str | None = None
        self._started = asyncio.Event() if _has_loop() else None
        # Ray restarts a dead actor by re-running __init__: start consuming right away, so a
        # restarted source resumes without anyone calling start().
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        from ray import serve

        from eventbus.eventing.sources._kafka import KafkaSource

        spec = self._config.spec
        src = spec.sources[self._index]
        assert src.kafka is not None
        handle = serve.get_app_handle(self._app)

        from eventbus.serving._wire import pack_records, unpack_encoded_outcomes

        index = self._index

        # Records cross undecoded and come back encoded: decoding and encoding run on the
        # replicas (which scale), this actor only moves bytes between Kafka and Serve.
        async def dispatch(records: list[Any]) -> list[Outcome]:
            return unpack_encoded_outcomes(await handle.process_records.remote(pack_records(records), index))

        sink = make_sink(spec.sink, default_bootstrap=self._bootstrap)
        dead = make_sink(spec.dead_letter, default_bootstrap=self._bootstrap) if spec.dead_letter else None
        batch = spec.serving.batch
        self._source = KafkaSource(
            src.kafka,
            pipeline=self._config.name,
            bootstrap_servers=src.kafka.bootstrap_servers or self._bootstrap,
            dispatch=dispatch,
            sink=sink,
            dead_letter=dead,
            max_batch=batch.max_size,
            linger_ms=batch.linger_ms,
            max_in_flight=batch.max_in_flight,
            decode_in_dispatch=True,
        )
        try:
            await sink.start()
            if dead is not None:
                await dead.start()
            await self._source.start()
            if self._started is not None:
                self._started.set()
            await self._source.run()
        except Exception as exc:  # noqa: BLE001 - surfaced through ready()/stats()
            self._error = f"{type(exc).__name__}: {exc}"
            log.exception("source %s[%d] of pipeline %r failed", "kafka", self._index, self._config.name)
            raise
        finally:
            await sink.stop()
            if dead is not None:
                await dead.stop()

    async def ready(self, timeout_s: float = 60.0) -> bool:
        """Wait until the consumer has started; raise if the source failed."""
        if self._task is None:
            self._started = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        assert self._started is not None
        waiter = asyncio.ensure_future(self._started.wait())
        done, _ = await asyncio.wait({waiter, self._task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._error is not None:
            raise RuntimeError(self._error)
        return self._started.is_set()

    async def stop(self, drain: bool = True) -> None:
        """Stop consuming; with ``drain``, finish and commit the batches in flight."""
        if self._source is not None:
            await self._source.stop(drain=drain)
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=30)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                self._task.cancel()

    def stats(self) -> dict[str, Any]:
        """The source's counters, and its error if it failed."""
        out: dict[str, Any] = dict(self._source.stats()) if self._source is not None else {}
        if self._error:
            out["error"] = self._error
        return out


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _tune_gc() -> None:
    # Batches allocate many short-lived containers; with the default generation-0 threshold
    # (700) the collector costs ~25% of a source's time. Collect less often, and keep the
    # long-lived startup objects out of every collection.
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
