"""The pipeline as a Ray Serve application: one deployment whose replicas run the steps.

Each deployed pipeline is its own Serve application (``eventbus-<name>``), so pipelines are
isolated: a redeploy or a crash of one touches no other. With ``source_placement: replica``
(the default) every replica also runs the pipeline's Kafka sources (``_replica_sources``);
with ``actor``, source actors call the deployment once per micro-batch through a
``DeploymentHandle`` (``process_records``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from ray import serve
from ray.serve.deployment import Application

from eventbus._internal.gc import tune_gc
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure, Outcome
from eventbus.observability._tracing import run_traced, tracer
from eventbus.pipelines._config import PipelineConfig

_INLINE_MAX = 256  # most events of a batch run on the replica's loop (pure pipelines only)

__all__ = ["APP_PREFIX", "PipelineDeployment", "app_name", "autoscaling_options", "build_app"]

APP_PREFIX = "eventbus-"


def app_name(pipeline: str) -> str:
    """The Serve application name of a pipeline."""
    return f"{APP_PREFIX}{pipeline}"


class PipelineDeployment:
    """A Serve replica running one pipeline's steps over micro-batches.

    Args:
        document: the pipeline document (validated again here).
        python_path: directories prepended to ``sys.path`` so that ``function:`` references
            resolve on the replica as they did where the pipeline was deployed from.
    """

    def __init__(
        self,
        document: dict[str, Any],
        python_path: list[str],
        runtime: dict[str, Any] | None = None,
    ) -> None:
        init_at = time.time()
        tune_gc()
        for p in reversed(python_path):
            if p not in sys.path:
                sys.path.insert(0, p)
        from eventbus.eventing._codecs import encode_kafka_binary, encode_kafka_structured
        from eventbus.pipelines._runner import PipelineRunner

        config = PipelineConfig.model_validate(document)
        import os

        from eventbus.observability._tracing import configure_replica

        configure_replica(config, os.environ, f"{os.getpid()}")
        redis_url = (runtime or {}).get("redis_url")
        if redis_url:  # {secret: NAME} references of the sinks resolve from the stack
            from eventbus._internal.secret_store import configure as configure_secrets

            configure_secrets(redis_url)
        # a PipelineRunner, or the CanaryRouter that wraps one (the same calls)
        self._runner: Any = PipelineRunner(config, redis_url=redis_url, base_dirs=python_path)
        if redis_url:  # canary upgrades route a share of each batch to the new version's steps
            from eventbus.serving._canary import CanaryRouter

            self._runner = CanaryRouter(self._runner, redis_url, python_path)
        self._events = 0
        self._in_flight = 0  # process/process_records calls running (actor placement)
        self._load_prev: tuple[float, int] | None = None
        sink = config.spec.sink.kafka if config.spec.sink is not None else None
        self._encode = (
            encode_kafka_structured
            if sink is not None and sink.mode == "structured"
            else encode_kafka_binary
        )
        from eventbus.eventing.sinks._kafka_avro_config import avro_encoder

        # value_format avro: outputs framed for the registry subject (schema id learnt on the
        # first batch; a registry outage raises out of process_records, so the batch waits)
        self._avro = avro_encoder(sink) if sink is not None else None
        if self._avro is not None:
            self._encode = self._avro.encode_event
        self._sources: Any = None
        if runtime and runtime.get("run_sources"):
            from eventbus.eventing._kafka_client import KafkaClientConfig
            from eventbus.serving._replica_sources import ReplicaSources

            client = runtime.get("kafka_client")
            self._sources = ReplicaSources(
                self._runner,
                config,
                runtime["kafka_bootstrap"],
                runtime.get("redis_url"),
                KafkaClientConfig.model_validate(client) if client else None,
                init_at=init_at,
            )
            self._sources.start()
        self._figures: Any = None
        if runtime and not runtime.get("run_sources") and runtime.get("redis_url"):
            # Source actors consume (source_placement: actor) and publish the sources' figures;
            # the steps run here, so the steps' figures are published from here.
            from eventbus.serving._figures import ThreadPublisher, entry_id

            runner = self._runner
            self._figures = ThreadPublisher(
                runtime["redis_url"],
                config.name,
                entry_id("replica"),
                lambda: {"sources": [], "metrics": {**runner.metrics(), "sources": []}},
            )
            self._figures.start()

    def __del__(self) -> None:
        # Serve calls this on graceful shutdown (redeploy, delete, scale-down): drain and
        # commit what is in flight before the replica goes away.
        self.close()

    def close(self) -> None:
        """Drain and commit the sources' in-flight batches and stop publishing figures (a
        shared host calls it when this pipeline leaves; idempotent)."""
        sources = getattr(self, "_sources", None)
        if sources is not None:
            self._sources = None
            sources.stop()
        figures = getattr(self, "_figures", None)
        if figures is not None:
            self._figures = None
            figures.stop()

    def check_health(self) -> None:
        """Ray Serve's health check (every ``health_check_period_s``): raising marks this
        replica unhealthy and Serve replaces it.

        Raises:
            RuntimeError: this replica's Kafka sources thread died or its loop is stuck.
        """
        sources = self._sources
        if sources is not None:
            sources.check_health()

    async def process(self, events: list[CloudEvent]) -> list[Outcome]:
        """Run the steps over one batch; one outcome per input event.

        A small batch of a pipeline whose steps are only filter/convert templates runs here,
        on the replica's loop (a few µs per event: the hop to a worker thread cost more than
        the work, ~1.3-1.5x the sync req/s); anything else runs on a worker thread, so that
        user code, models, joins and the solver never block the loop.
        """
        if len(events) <= _INLINE_MAX and getattr(self._runner, "pure", False):
            return self._process(events)
        return await asyncio.to_thread(self._process, events)

    def _process(self, events: list[CloudEvent]) -> list[Outcome]:
        self._events += len(events)
        self._in_flight += 1
        try:
            if tracer() is not None:
                return run_traced(self._runner, events)
            outcomes: list[Outcome] = self._runner.run(events)
            return outcomes
        finally:
            self._in_flight -= 1

    async def process_after(self, step_index: int, events: list[CloudEvent]) -> list[Outcome]:
        """Run what step ``step_index``'s timer fired (closed aggregate windows) through the
        steps after it; one outcome per event (the source actor's timers call this)."""
        outcomes: list[Outcome] = await asyncio.to_thread(
            self._runner.run_after, step_index, events
        )
        return outcomes

    def process_records(self, blob: bytes, source_index: int) -> bytes:
        """Decode raw Kafka records of source ``source_index``, run the steps, and encode the
        outputs for the sink: the source actor then only moves bytes.

        A record that does not decode gets ``Failure(step="decode")``; an output the sink
        cannot encode fails its input with ``Failure(step="sink")``.
        """
        self._in_flight += 1
        try:
            return self._process_records(blob, source_index)
        finally:
            self._in_flight -= 1

    def _process_records(self, blob: bytes, source_index: int) -> bytes:
        from eventbus.eventing._codecs import KafkaRecord, decode_kafka_records
        from eventbus.serving._wire import pack_encoded_outcomes, unpack_records

        records = unpack_records(blob)
        src = self._runner.config.consumed_sources[source_index]
        outcomes: list[Any] = [None] * len(records)
        events, errors = decode_kafka_records(
            records, default_type=src.type, default_source=src.source
        )
        index: range | list[int] = range(len(records))
        if errors:
            for i, exc in errors:
                outcomes[i] = Failure("decode", "EventDecodeError", str(exc))
            index = [i for i, o in enumerate(outcomes) if o is None]
        self._events += len(records)
        if self._avro is not None and not self._avro.ready:
            self._avro.resolve_sync()
        encode = self._encode
        origins = (
            [f"{records[i].topic}[{records[i].partition}]" for i in index]
            if self._runner.uses_origins
            else None
        )
        for i, result in zip(index, self._runner.run(events, origins=origins)):
            if type(result) is not list:
                outcomes[i] = result
                continue
            try:
                encoded = []
                for e in result:
                    headers, value = encode(e)
                    pkey = e.attributes.get("partitionkey")
                    key = (
                        None
                        if pkey is None
                        else (pkey.encode() if isinstance(pkey, str) else str(pkey).encode())
                    )
                    encoded.append(KafkaRecord(headers, value, key))
                outcomes[i] = encoded
            except Exception as exc:  # noqa: BLE001 - an unencodable output fails its input
                outcomes[i] = Failure("sink", type(exc).__name__, str(exc))
        return pack_encoded_outcomes(outcomes)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """This replica's load, for the pipeline's autoscaling policy (``_autoscale``); Serve
        calls it every few seconds when the deployment autoscales."""
        import time

        if self._sources is not None:
            return await self._sources.load()  # type: ignore[no-any-return]
        now = time.monotonic()
        prev, self._load_prev = self._load_prev, (now, self._events)
        rate = (
            (self._events - prev[1]) / (now - prev[0])
            if prev is not None and now > prev[0]
            else 0.0
        )
        return {"eventbus_in_flight": float(self._in_flight), "eventbus_events_per_s": rate}

    def stats(self) -> dict[str, Any]:
        """Events processed by this replica, per-step error counts, and its process id."""
        import os

        out: dict[str, Any] = {
            "events": self._events,
            "steps": self._runner.stats(),
            "pid": os.getpid(),
        }
        if self._sources is not None:
            out["sources"] = self._sources.stats()
        return out


def build_app(
    config: PipelineConfig,
    python_path: list[str],
    runtime: dict[str, Any] | None = None,
) -> Application:
    """Build the Serve application of a pipeline.

    A ``min: 0`` pipeline runs at least one replica: Serve's own scaling from zero needs
    requests, and Kafka sources send none. At zero the controller deletes the application (its
    ``ScaleToZero`` watcher decides) and runs it again on lag or on a sync call.

    Args:
        config: the pipeline.
        python_path: where its functions import from.
        runtime: ``{"run_sources": bool, "kafka_bootstrap": str, "redis_url": str}``; with
            ``run_sources`` every replica consumes the pipeline's sources itself.
    """
    serving = config.spec.serving
    bounds = serving.replica_bounds
    options: dict[str, Any] = {
        "name": "pipeline",
        "ray_actor_options": _actor_options(serving, python_path),
        "max_ongoing_requests": max(
            8, serving.batch.max_in_flight * 2 * max(1, len(config.consumed_sources))
        ),
        "logging_config": {"enable_access_log": False, "log_level": "WARNING"},
        "health_check_period_s": 2,
        "graceful_shutdown_timeout_s": 30,
        # Serve sleeps this long before it first looks for requests still running on a
        # replica that stops (default 2 s): every scale to zero, scale-down, redeploy and
        # delete waited it out, though the sources' drain (in __del__) comes after it anyway
        "graceful_shutdown_wait_loop_s": 0.2,
    }
    if max(1, bounds.min) == bounds.max:
        options["num_replicas"] = bounds.max
    else:
        options["autoscaling_config"] = autoscaling_options(config)
    if serving.placement is not None and serving.placement.spread:
        options["max_replicas_per_node"] = 1  # a lost host takes one replica, not all
    # Upgrades replace at most a quarter of the replicas at a time (at least one), starting
    # each replacement before its old replica stops (surge), so capacity never drops.
    options["max_surge_percent"] = 25
    # Ray's annotations do not cover this call form of serve.deployment
    make: Any = serve.deployment
    deployment = make(PipelineDeployment, rolling_update_percentage=0.25).options(**options)
    app: Application = deployment.bind(config.to_document(), python_path, runtime)
    return app


def _actor_options(serving: Any, python_path: list[str]) -> dict[str, Any]:
    """A replica's Ray resources and runtime environment (per pipeline: isolation)."""
    options: dict[str, Any] = {"num_cpus": serving.num_cpus}
    if serving.memory_mb is not None:
        options["memory"] = serving.memory_mb * 1024 * 1024
    if serving.placement is not None and serving.placement.node_labels:
        options["label_selector"] = dict(serving.placement.node_labels)
    if serving.runtime_env is not None:
        options["runtime_env"] = serving.runtime_env.to_ray(python_path[0] if python_path else None)
    return options


def autoscaling_options(config: PipelineConfig) -> dict[str, Any]:
    """The Serve ``autoscaling_config`` of a pipeline whose replica bounds differ: the
    ``serving.autoscaling`` policy (``_autoscale.LoadPolicy``) on the replicas' load reports."""
    from eventbus.pipelines._autoscaling_config import AutoscalingConfig

    serving = config.spec.serving
    bounds = serving.replica_bounds
    auto = serving.autoscaling or AutoscalingConfig()
    return {
        "min_replicas": max(1, bounds.min),  # zero is the controller's (scale to zero)
        "max_replicas": bounds.max,
        "target_ongoing_requests": max(1, serving.batch.max_in_flight),
        "metrics_interval_s": auto.metrics_interval_s,
        "look_back_period_s": auto.look_back_s,
        "upscale_delay_s": auto.upscale_delay_s,
        "downscale_delay_s": auto.downscale_delay_s,
        "policy": {
            "policy_function": "eventbus.serving._autoscale:LoadPolicy",
            "policy_kwargs": {
                "config": auto.model_dump(mode="json"),
                "placement": serving.source_placement,
            },
        },
    }
