"""Sources that run inside a pipeline replica (``serving.source_placement: replica``).

Each replica is itself a member of the pipeline's consumer groups: it consumes its share of
the partitions, runs the steps on each micro-batch in process and produces the outputs, then
commits. No event crosses a process boundary between Kafka and the sink, which is what makes
this the fast path (see docs/concepts/architecture.md for the measurements). Scaling replicas scales
consumers, up to the partition count.

The Kafka I/O runs on its own thread with its own event loop, so the replica's Serve loop
stays free for requests (HTTP/gRPC invocations and ``stats``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from typing import Any

from eventbus._internal.gc import collect_periodically
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing._outcome import Outcome
from eventbus.pipelines._config import PipelineConfig, SinkConfig
from eventbus.pipelines._runner import PipelineRunner
from eventbus.serving._outputs import delivery_policy, make_sink, source_sinks, sweep_forever
from eventbus.serving._replica_figures import ReplicaFigures, clear_stats, read_stats
from eventbus.serving._replica_health import SourcesHealth
from eventbus.serving._step_threads import StepThreads

__all__ = [
    "ReplicaSources",
    "clear_stats",
    "decoding_dispatch",
    "delivery_policy",
    "make_sink",
    "read_stats",
    "source_sinks",
    "sweep_forever",
]

log = logging.getLogger("eventbus.serving.sources")


def decoding_dispatch(src: Any, run: Any, blocking: bool, threads: Any = None) -> Any:
    """A dispatch of undecoded records (``decode_in_dispatch``) that hands the runner each
    event's source partition: steps that keep state per partition (an event-time join's
    watermark) need it. A record that does not decode fails with ``step="decode"``. The
    batch runs where ``threads`` (a :class:`StepThreads`) says, else on a worker thread when
    ``blocking``, else here."""
    from eventbus.eventing._codecs import decode_kafka_records
    from eventbus.eventing._outcome import Failure

    def call(records: list[Any]) -> list[Outcome]:
        events, errors = decode_kafka_records(
            records, default_type=src.type, default_source=src.source
        )
        outcomes: list[Any] = [None] * len(records)
        index: range | list[int] = range(len(records))
        if errors:
            for i, exc in errors:
                outcomes[i] = Failure("decode", "EventDecodeError", str(exc))
            index = [i for i, o in enumerate(outcomes) if o is None]
        origins = [f"{records[i].topic}[{records[i].partition}]" for i in index]
        for i, outcome in zip(index, run(events, origins=origins)):
            outcomes[i] = outcome
        return outcomes

    async def dispatch(records: list[Any]) -> list[Outcome]:
        if threads is not None:
            outcomes: list[Outcome] = await threads.call(call, records)
            return outcomes
        return await asyncio.to_thread(call, records) if blocking else call(records)

    return dispatch


class ReplicaSources:
    """Runs every source of a pipeline in this process, dispatching to ``runner`` in process.

    Args:
        runner: the replica's step runner.
        config: the pipeline.
        kafka_bootstrap: default Kafka bootstrap servers.
        redis_url: where live counters are published (None: not published).
        kafka_client: the stack's Kafka connection settings (TLS, SASL); None: plaintext.
    """

    def __init__(
        self,
        runner: PipelineRunner,
        config: PipelineConfig,
        kafka_bootstrap: str,
        redis_url: str | None,
        kafka_client: KafkaClientConfig | None = None,
        init_at: float | None = None,
    ) -> None:
        self._runner = runner
        self._config = config
        self._threads = StepThreads([])  # where the steps run: made in _run, from the steps
        self._bootstrap = kafka_bootstrap
        self._kafka_client = kafka_client
        self._redis_url = redis_url
        self.replica_id = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._doorbells: list[Any] = []  # RedisDoorbell of each source that parks
        self._sources: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._stop_event: asyncio.Event | None = None
        self.health = SourcesHealth(config.name)
        self.schedules: list[Any] = []  # the schedule runners (their counters)
        #: When this replica started its parts (epoch s), published with its figures: the
        #: replica's constructor (``init_at``), the sources' start (``sources_at``), their
        #: consumers running (``started_at``) and their consumer groups' first assignment
        #: (``assigned_at``), for a cold start's breakdown (``benchmarks/idle.py``).
        self.startup: dict[str, float] = {"init_at": init_at or time.time()}
        # counters, metrics and start marks to Redis; the autoscaler's load (_replica_figures)
        self.figures = ReplicaFigures(
            config.name, runner, self._sources, redis_url, self.replica_id, self.startup
        )

    def start(self, timeout_s: float = 60.0) -> None:
        """Start consuming; returns once every source joined its group.

        Raises:
            RuntimeError: a source could not start (broker unreachable...).
        """
        _normal_priority()
        self.startup["sources_at"] = time.time()
        self._thread = threading.Thread(target=self._main, name="eventbus-sources", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            msg = f"the sources of pipeline {self._config.name!r} did not start within {timeout_s:g} s"
            raise RuntimeError(msg)
        if self._error is not None:
            msg = f"a source of pipeline {self._config.name!r} failed to start: {self._error}"
            raise RuntimeError(msg) from self._error

    def check_health(self) -> None:
        """Raise when the sources thread died or its loop is stuck (see ``_replica_health``).

        Raises:
            RuntimeError: the sources cannot be making progress.
        """
        self.health.check(self._thread, self._error)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop consuming: finish and commit the batches in flight, then close."""
        self.health.stopping = True
        loop, stop = self._loop, self._stop_event
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def stats(self) -> list[dict[str, int]]:
        """Per source: its counters."""
        return [dict(s.stats()) for s in self._sources]

    async def load(self) -> dict[str, float]:
        """This replica's load for the autoscaler (``_autoscale``): consumer lag of its
        partitions, batches in flight, events processed and records arriving per second (since
        the previous call), and its partition count. Read on the sources' own loop (await it
        from another loop)."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._thread is None or not self._thread.is_alive():
            return {}
        return await asyncio.wait_for(
            asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._load(), loop)), 5.0
        )

    async def _load(self) -> dict[str, float]:
        return self.figures.load()

    def metrics(self) -> dict[str, Any]:
        """The observability snapshot published beside the counters: the runner's per-step
        counters and histograms, and per source its latency histogram and consumer lag."""
        out = self._runner.metrics()
        out["sources"] = [s.metrics() for s in self._sources]
        return out

    # -- the sources' thread -------------------------------------------------------------------
    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:
            self._error = exc
            log.exception("sources of pipeline %r stopped", self._config.name)
        finally:
            self._started.set()

    async def _run(self) -> None:
        from eventbus.eventing.sources._kafka import FetchSettings, KafkaSource

        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._threads = StepThreads(self._runner.steps)
        self._threads.tune_switching()  # steps on a worker thread: the GIL handed over sooner
        spec = self._config.spec
        run = self._runner.run
        from eventbus.observability._tracing import TracedSink, run_traced, tracer

        traced = tracer() is not None  # tracing on: spans per sampled event, else zero cost
        if traced:
            import functools

            run = functools.partial(run_traced, self._runner)

        def sink_of(cfg: SinkConfig) -> Any:
            sink = make_sink(
                cfg, default_bootstrap=self._bootstrap, default_client=self._kafka_client
            )
            if traced:
                target = getattr(cfg.options, "topic", None) or cfg.kind
                return TracedSink(sink, f"eventbus.sink {target}")
            return sink

        # Model steps wait on another deployment (a DeploymentHandle call, which may not block
        # an event loop): their batches run on worker threads, so batches in flight overlap and
        # the model's dynamic batching can merge them. Steps waiting on their state (an
        # aggregate's Redis script) run on one worker thread in order, so the loop fetches and
        # delivers meanwhile (see _step_threads).
        threads = self._threads

        async def dispatch(events: list[CloudEvent]) -> list[Outcome]:
            outcomes: list[Outcome] = await threads.call(run, events)
            return outcomes

        origins = self._runner.uses_origins
        blocking = any(s.blocking for s in self._runner.steps)
        from eventbus.eventing._broker import is_tansu

        # the doorbell only where a waiting fetch is not woken by new records, the join
        # bridge only where a first join is held (both: Tansu)
        tansu = await is_tansu(self._bootstrap, self._kafka_client)
        for i, src in enumerate(self._config.consumed_sources):
            self._sources.append(
                KafkaSource(
                    src,
                    pipeline=self._config.name,
                    bootstrap_servers=src.bootstrap_servers or self._bootstrap,
                    client=self._kafka_client,
                    dispatch=decoding_dispatch(src, run, blocking, threads)
                    if origins
                    else dispatch,
                    sinks=source_sinks(self._config, sink_of),
                    fetch=FetchSettings(
                        max_batch=spec.serving.batch.max_size,
                        linger_ms=self._config.linger_ms_of(src),
                        session_timeout_ms=src.session_timeout_ms,
                        heartbeat_interval_ms=src.heartbeat_interval_ms,
                        max_in_flight=spec.serving.batch.max_in_flight,
                        decode_in_dispatch=origins,
                        doorbell=self._doorbell(i, src) if tansu else None,
                        bridge=self._bridge(i) if tansu else None,
                        in_order=self._config.in_order,
                    ),
                    delivery=delivery_policy(self._config, self._redis_url),
                )
            )
        try:
            for s in self._sources:
                await s.start()
        except BaseException as exc:
            self._error = exc
            for s in self._sources:
                await s.stop(drain=False)
            raise
        self._started.set()
        self.startup["started_at"] = time.time()
        noted = asyncio.create_task(self.figures.note_assigned())
        tasks = [asyncio.create_task(s.run()) for s in self._sources]
        publisher = asyncio.create_task(self.figures.publish_forever())
        sweeper = asyncio.create_task(self._sweep_joins())
        collector = asyncio.create_task(collect_periodically())
        stopper = asyncio.create_task(self._stop_event.wait())
        heartbeat = asyncio.create_task(self.health.beat_forever())
        schedules = asyncio.create_task(self._run_schedules())
        await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        self._stop_event.set()  # the schedules give their leases back
        await asyncio.gather(schedules, return_exceptions=True)
        for task in tasks:  # a source that stopped by itself: keep why, for check_health
            if task.done() and not task.cancelled() and task.exception() is not None:
                self._error = task.exception()
                log.error("a source of pipeline %r stopped: %s", self._config.name, self._error)
        for s in self._sources:
            await s.stop(drain=True)
        await asyncio.gather(*tasks, return_exceptions=True)
        background = (publisher, collector, sweeper, heartbeat, noted)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self.figures.write(final=True)
        self._threads.close()
        for bell in self._doorbells:
            with contextlib.suppress(Exception):
                await bell.close()

    def _doorbell(self, index: int, src: Any) -> Any:
        """The doorbell of consumed source ``index`` (see ``_doorbell``), or None: it reads
        another Kafka than the stack's (the controller's ringer watches that one only), or
        the Redis is a cluster (pub/sub there is per node). Asked on Tansu only: Apache Kafka
        answers a waiting fetch as soon as records arrive, so an idle source long-polls there
        (first event after idleness ~28 ms long-polling vs ~395 ms parked, idle.py)."""
        from eventbus._internal.redis_client import is_cluster
        from eventbus.serving._doorbell import RedisDoorbell

        own_kafka = src.bootstrap_servers in (None, self._bootstrap) and src.client is None
        if not self._redis_url or is_cluster(self._redis_url) or not own_kafka:
            return None
        bell = RedisDoorbell(self._redis_url, f"{self.replica_id}/{index}")
        self._doorbells.append(bell)
        return bell

    def _bridge(self, index: int) -> Any:
        """The join bridge of consumed source ``index`` (see ``_bridge``), or None: the
        pipeline does not scale to zero, or the source reads another Kafka than the stack's.
        Asked on Tansu only: Apache Kafka answers a woken group's first join in ~25-45 ms."""
        from eventbus.serving._bridge import RedisJoinBridge, bridged_groups

        group = bridged_groups(self._config, self._bootstrap).get(index)
        if not self._redis_url or group is None:
            return None
        return RedisJoinBridge(self._redis_url, group, f"{self.replica_id}/{index}")

    async def _run_schedules(self) -> None:
        """Emit the pipeline's schedule ticks into its ingress topic (one replica at a time
        holds each schedule; see ``_schedules``)."""
        from eventbus.serving._schedules import run_schedules

        assert self._stop_event is not None
        try:
            await run_schedules(
                self._config,
                bootstrap=self._bootstrap,
                redis_url=self._redis_url,
                stop=self._stop_event,
                kafka_client=self._kafka_client,
                runners=self.schedules,
            )
        except Exception:
            log.exception("the schedules of pipeline %r stopped", self._config.name)
            raise

    async def _sweep_joins(self) -> None:
        """Close join windows on a timer: outer-join results to the sink, evicted keys to the
        dead-letter sink, then forget them (claims are leased: a replica that dies mid-way is
        taken over)."""
        timers = self._runner.timers()
        if not timers:
            return
        runner = self._runner
        threads = self._threads

        async def follow(step_index: int, events: list[CloudEvent]) -> list[Outcome]:
            # as the sources' dispatch: on this loop (between batches), on a worker thread when
            # a later step waits on another deployment, or queued between batches on the
            # ordered thread
            outcomes: list[Outcome] = await threads.call(runner.run_after, step_index, events)
            return outcomes

        await sweep_forever(
            timers,
            self._config,
            self._bootstrap,
            self._redis_url,
            kafka_client=self._kafka_client,
            follow=follow,
        )


def _normal_priority() -> None:
    # Ray starts workers at niceness 15 so that its own daemons win the CPU. A replica that
    # consumes Kafka is data plane, as latency-bound as the broker it talks to (nice 0): at
    # 15 it loses every contested time slice to it and to any client on the machine, which
    # showed as a p99 latency several times the baseline's. Raising priority needs
    # CAP_SYS_NICE; without it the replica stays at Ray's default.
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except (PermissionError, OSError):
        log.info(
            "cannot raise the replica's CPU priority (no CAP_SYS_NICE); it stays at nice %d",
            os.getpriority(os.PRIO_PROCESS, 0),
        )
