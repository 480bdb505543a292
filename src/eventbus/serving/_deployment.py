"""The pipeline as a Ray Serve application: one deployment whose replicas run the steps.

Each deployed pipeline is its own Serve application (``eventbus-<name>``), so pipelines are
isolated: a redeploy or a crash of one touches no other. With ``source_placement: replica``
(the default) every replica also runs the pipeline's Kafka sources (``_replica_sources``);
with ``actor``, source actors call the deployment once per micro-batch through a
``DeploymentHandle`` (``process_records``).
"""

from __future__ import annotations

import sys
from typing import Any

from ray import serve
from ray.serve.deployment import Application

from eventbus._internal.gc import tune_gc
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure, Outcome
from eventbus.observability._tracing import run_traced, tracer
from eventbus.pipelines._config import PipelineConfig

__all__ = ["APP_PREFIX", "PipelineDeployment", "app_name", "build_app"]

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
        self, document: dict[str, Any], python_path: list[str], runtime: dict[str, Any] | None = None
    ) -> None:
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
        self._runner = PipelineRunner(config, redis_url=(runtime or {}).get("redis_url"), base_dirs=python_path)
        self._events = 0
        sink = config.spec.sink.kafka
        self._encode = encode_kafka_structured if sink is not None and sink.mode == "structured" else encode_kafka_binary
        self._sources: Any = None
        if runtime and runtime.get("run_sources"):
            from eventbus.serving._replica_sources import ReplicaSources

            self._sources = ReplicaSources(self._runner, config, runtime["kafka_bootstrap"], runtime.get("redis_url"))
            self._sources.start()

    def __del__(self) -> None:
        # Serve calls this on graceful shutdown (redeploy, delete, scale-down): drain and
        # commit what is in flight before the replica goes away.
        sources = getattr(self, "_sources", None)
        if sources is not None:
            sources.stop()

    def process(self, events: list[CloudEvent]) -> list[Outcome]:
        """Run the steps over one batch; one outcome per input event."""
        self._events += len(events)
        if tracer() is not None:
            return run_traced(self._runner, events)
        return self._runner.run(events)

    def process_records(self, blob: bytes, source_index: int) -> bytes:
        """Decode raw Kafka records of source ``source_index``, run the steps, and encode the
        outputs for the sink: the source actor then only moves bytes.

        A record that does not decode gets ``Failure(step="decode")``; an output the sink
        cannot encode fails its input with ``Failure(step="sink")``.
        """
        from eventbus.errors import EventDecodeError
        from eventbus.eventing._codecs import KafkaRecord, decode_kafka
        from eventbus.serving._wire import pack_encoded_outcomes, unpack_records

        records = unpack_records(blob)
        src = self._runner.config.consumed_sources[source_index]
        default_type, own_source = src.type, src.source
        outcomes: list[Any] = [None] * len(records)
        events: list[CloudEvent] = []
        index: list[int] = []
        for i, r in enumerate(records):
            try:
                events.append(
                    decode_kafka(
                        r.value, r.headers, key=r.key, topic=r.topic, partition=r.partition, offset=r.offset,
                        default_type=default_type, default_source=own_source or f"kafka://{r.topic}",
                    )
                )
                index.append(i)
            except EventDecodeError as exc:
                outcomes[i] = Failure("decode", "EventDecodeError", str(exc))
        self._events += len(records)
        encode = self._encode
        for i, result in zip(index, self._runner.run(events)):
            if type(result) is not list:
                outcomes[i] = result
                continue
            try:
                encoded = []
                for e in result:
                    headers, value = encode(e)
                    pkey = e.attributes.get("partitionkey")
                    key = None if pkey is None else (pkey.encode() if isinstance(pkey, str) else str(pkey).encode())
                    encoded.append(KafkaRecord(headers, value, key))
                outcomes[i] = encoded
            except Exception as exc:  # noqa: BLE001 - an unencodable output fails its input
                outcomes[i] = Failure("sink", type(exc).__name__, str(exc))
        return pack_encoded_outcomes(outcomes)

    def stats(self) -> dict[str, Any]:
        """Events processed by this replica, per-step error counts, and its process id."""
        import os

        out: dict[str, Any] = {"events": self._events, "steps": self._runner.stats(), "pid": os.getpid()}
        if self._sources is not None:
            out["sources"] = self._sources.stats()
        return out


def build_app(config: PipelineConfig, python_path: list[str], runtime: dict[str, Any] | None = None) -> Application:
    """Build the Serve application of a pipeline.

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
        "ray_actor_options": {"num_cpus": serving.num_cpus},
        "max_ongoing_requests": max(8, serving.batch.max_in_flight * 2 * max(1, len(config.consumed_sources))),
        "logging_config": {"enable_access_log": False, "log_level": "WARNING"},
        "health_check_period_s": 2,
        "graceful_shutdown_timeout_s": 30,
    }
    if bounds.min == bounds.max:
        options["num_replicas"] = bounds.min
    else:
        options["autoscaling_config"] = {
            "min_replicas": bounds.min,
            "max_replicas": bounds.max,
            "target_ongoing_requests": max(1, serving.batch.max_in_flight),
        }
    deployment = serve.deployment(PipelineDeployment).options(**options)
    return deployment.bind(config.to_document(), python_path, runtime)
