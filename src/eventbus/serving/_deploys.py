"""The controller's pipeline reconciler: deploy (and redeploy) a pipeline, keep its versions,
delete it, and restore every stored pipeline after a controller (re)start.

The desired state is the Redis hash ``keys.PIPELINES`` (document, YAML, version per pipeline)
and its kept versions; :class:`Deploys` makes Serve and the source actors match it. Every
change of one pipeline runs under that pipeline's lock (``_locks``): the caller holds it
around :meth:`Deploys.apply`, :meth:`Deploys.delete` takes it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from eventbus._internal import keys
from eventbus.errors import DeployError, PipelineConfigError, PipelineNotFoundError
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._locks import PipelineLocks
from eventbus.serving._serve_apps import ServeApps, root_cause
from eventbus.serving._source_actors import (
    actor_count,
    ensure_sources,
    start_sources,
    stop_sources,
)
from eventbus.serving._topics import create_ingress_topic, create_missing_topics

__all__ = ["KEEP_VERSIONS", "Deploys", "check_chained", "load_record", "not_deployed"]

log = logging.getLogger("eventbus.serving.controller")

#: Versions kept per pipeline (the oldest are forgotten).
KEEP_VERSIONS = 20


def not_deployed(name: str) -> PipelineNotFoundError:
    """The error for a pipeline name that is not deployed."""
    msg = f"no pipeline named {name!r} is deployed; `eventbus list` shows the deployed ones"
    return PipelineNotFoundError(msg)


def load_record(redis: Any, name: str) -> dict[str, Any] | None:
    """The stored record of a pipeline (document, YAML, version...), or None."""
    raw = redis.hget(keys.PIPELINES, name)
    record: dict[str, Any] | None = json.loads(raw) if raw else None
    return record


def check_chained(redis: Any, config: PipelineConfig) -> None:
    """Every ``pipeline:`` sink of ``config`` names a deployed pipeline (in ``redis``'s
    ``keys.PIPELINES``) that consumes its ingress topic.

    Raises:
        DeployError: naming the sink, the pipeline and the fix (nothing is deployed).
    """
    from eventbus.registry import sources

    for path, sink in config.spec.output_paths().items():
        if sink.kind != "pipeline":
            continue
        target = sink.options.name
        raw = redis.hget(keys.PIPELINES, target)
        if not raw:
            deployed = ", ".join(sorted(redis.hkeys(keys.PIPELINES))) or "none"
            msg = (
                f"pipeline {config.name!r} could not be deployed: spec.{path}.pipeline names "
                f"pipeline {target!r}, which is not deployed (deployed: {deployed}); deploy "
                f"{target!r} first, or fix the name"
            )
            raise DeployError(msg)
        kinds = [next(iter(s)) for s in json.loads(raw)["document"]["spec"]["sources"]]
        if not any(sources.get(k).trait("ingress") for k in kinds if k in sources):
            msg = (
                f"pipeline {config.name!r} could not be deployed: spec.{path}.pipeline names "
                f"pipeline {target!r}, which has no http, grpc or pipeline source, so nothing "
                f"consumes what is sent to it; add '- pipeline: {{}}' to the sources of {target!r}"
            )
            raise DeployError(msg)


class Deploys:
    """Deploys, deletes and restores pipelines (see the module docstring).

    Args:
        redis: the controller's Redis client (``decode_responses=True``).
        apps: the Serve side (applications, hosts, Serve's pace).
        models: the model applications (``_models.ModelControl``).
        scaler: the scale-to-zero watcher (a deploy is activity; a delete forgets).
        locks: the pipelines' locks.
        kafka_bootstrap, kafka_client: the stack's Kafka (topics are created there).
    """

    def __init__(
        self,
        redis: Any,
        apps: ServeApps,
        models: Any,
        scaler: Any,
        locks: PipelineLocks,
        kafka_bootstrap: str,
        kafka_client: KafkaClientConfig | None,
    ) -> None:
        self._redis = redis
        self.apps = apps
        self.models = models
        self.scaler = scaler
        self.locks = locks
        self.kafka_bootstrap = kafka_bootstrap
        self.kafka_client = kafka_client
        # model applications are shared by the pipelines that call them: one change at a time
        self._models_lock = threading.Lock()

    def load(self, name: str) -> dict[str, Any] | None:
        """The stored record of a pipeline, or None."""
        return load_record(self._redis, name)

    def get(self, name: str) -> dict[str, Any]:
        """The stored record of a pipeline. Raises: PipelineNotFoundError."""
        record = self.load(name)
        if record is None:
            raise not_deployed(name)
        return record

    def apply(
        self,
        config: PipelineConfig,
        text: str,
        filename: str,
        python_path: list[str],
        *,
        rollback_of: int | None = None,
    ) -> dict[str, Any]:
        """Deploy (or redeploy) ``config`` (parsed from ``text``) as the pipeline's next
        version; a failed redeploy puts the last good version back. The caller holds the
        pipeline's lock.

        Raises:
            PipelineConfigError: a secret reference does not resolve where it will be used.
            DeployError: a ``pipeline:`` sink's target, or the Serve application or a source
                could not start.
        """
        name = config.name
        check_chained(self._redis, config)
        from eventbus.serving._secret_check import secret_reference_problems

        unresolved = secret_reference_problems(config, self._redis, filename)
        if unresolved:  # refused before anything stops or starts
            raise PipelineConfigError(unresolved)
        from eventbus.serving._topic_checks import check_topics

        # every Kafka topic exists, or carries `create:` and is created now (else refused)
        check_topics(config, self.kafka_bootstrap, self.kafka_client)
        from eventbus.serving._placement import live_nodes, placement_problems

        # replicas no live node can take would wait forever: refused, naming the nodes
        placed = config.spec.serving.placement is not None
        misplaced = placement_problems(config.spec.serving, live_nodes()) if placed else []
        if misplaced:
            msg = f"pipeline {name!r} could not be deployed:\n" + "\n".join(misplaced)
            raise DeployError(msg)
        from eventbus.serving._schema_checks import check_sink_schemas

        # value_format avro outputs: compatible with their subjects (and registered)
        check_sink_schemas(config)
        previous = self.load(name)
        version = (previous["version"] + 1) if previous else 1
        if previous is not None:
            stop_sources(name, actor_count(PipelineConfig.model_validate(previous["document"])))
        try:
            create_ingress_topic(config, self.kafka_bootstrap, self.kafka_client)
            self._ensure_models(config)
            self.apps.run(config, python_path)
            start_sources(config, self.apps.runtime(run_sources=False))
        except Exception as exc:  # noqa: BLE001 - undone, then raised as a DeployError
            self._undo(config, previous)
            msg = f"pipeline {name!r} could not be deployed: {root_cause(exc)}"
            raise DeployError(msg) from None
        record = {
            "name": name,
            "version": version,
            "document": config.to_document(),
            "yaml": text,
            "filename": filename,
            "python_path": python_path,
            "deployed_at": time.time(),
        }
        if rollback_of is not None:
            record["rollback_of"] = rollback_of
        self.scaler.track(config)  # a deploy runs replicas: the idle time starts again
        self._store(record)
        info: dict[str, Any] = {
            "name": name,
            "version": version,
            "sources": len(config.spec.sources),
            "steps": len(config.spec.steps),
        }
        if rollback_of is not None:
            info["rollback_of"] = rollback_of
        return info

    def _undo(self, config: PipelineConfig, previous: dict[str, Any] | None) -> None:
        """After a failed deploy: the last good version back, or nothing left running."""
        stop_sources(config.name, actor_count(config))
        if previous is None:
            self.apps.delete(config.name)
            return
        old = PipelineConfig.model_validate(previous["document"])
        try:
            self.apps.run(old, previous["python_path"])
            start_sources(old, self.apps.runtime(run_sources=False))
        except Exception:
            log.exception("restoring pipeline %r version %s failed", old.name, previous["version"])

    def _store(self, record: dict[str, Any]) -> None:
        """The pipeline's record and kept version, its version counter bumped, any record
        of it at zero cleared (it runs), versions beyond :data:`KEEP_VERSIONS` forgotten."""
        name, version = record["name"], record["version"]
        versions_key = keys.pipeline_versions(name)
        old = range(max(1, version - 2 * KEEP_VERSIONS), version - KEEP_VERSIONS + 1)
        with self._redis.pipeline(transaction=True) as tx:
            tx.hdel(keys.SCALED_TO_ZERO, name)
            tx.hdel(keys.DEGRADED, name)  # its topics were just checked
            tx.hset(keys.PIPELINES, name, json.dumps(record))
            tx.incr(keys.PIPELINES_VERSION)
            tx.hset(versions_key, str(version), json.dumps(record))
            tx.hdel(versions_key, *[str(v) for v in old] or ["0"])
            tx.execute()

    def versions(self, name: str) -> list[dict[str, Any]]:
        """The kept versions of a pipeline, newest first (see ``Controller.versions``)."""
        current = self.get(name)["version"]
        out = []
        for raw in self._redis.hgetall(keys.pipeline_versions(name)).values():
            rec = json.loads(raw)
            out.append(
                {
                    "version": rec["version"],
                    "deployed_at": rec["deployed_at"],
                    "filename": rec["filename"],
                    "serving": rec["version"] == current,
                    "rollback_of": rec.get("rollback_of"),
                }
            )
        return sorted(out, key=lambda r: -r["version"])

    def kept(self, name: str, version: int | None) -> dict[str, Any]:
        """The record of a kept version (None: the one before the serving version).

        Raises:
            PipelineNotFoundError: no such pipeline, or no such kept version.
        """
        current = self.get(name)["version"]
        kept = {int(v): raw for v, raw in self._redis.hgetall(keys.pipeline_versions(name)).items()}
        if version is None:
            earlier = [v for v in kept if v < current]
            if not earlier:
                msg = f"pipeline {name!r} has no version before {current} to roll back to; `eventbus versions {name}` lists them"
                raise PipelineNotFoundError(msg)
            version = max(earlier)
        if version not in kept:
            msg = (
                f"pipeline {name!r} has no kept version {version} (kept: {sorted(kept)}); "
                f"`eventbus versions {name}` lists them"
            )
            raise PipelineNotFoundError(msg)
        record: dict[str, Any] = json.loads(kept[version])
        return record

    def delete(self, name: str) -> None:
        """Drain the sources, delete the application and forget the pipeline, under its
        lock (not across its deploy or scale action: a ``serve.run`` of an application being
        deleted waits for it forever).

        Raises:
            PipelineNotFoundError: no pipeline of that name is deployed.
        """
        with self.locks.of(name):
            record = self.get(name)
            stop_sources(name, actor_count(PipelineConfig.model_validate(record["document"])))
            self.apps.delete(name)
            try:
                with self._models_lock:
                    documents = [
                        json.loads(r)["document"]
                        for r in self._redis.hgetall(keys.PIPELINES).values()
                    ]
                    self.models.release(name, documents)  # its own document among them
            except Exception:
                log.exception("releasing the models of %r failed", name)
            self.scaler.forget(name)
            with self._redis.pipeline(transaction=True) as tx:
                tx.hdel(keys.PIPELINES, name)
                tx.incr(keys.PIPELINES_VERSION)
                tx.execute()
            self._redis.hdel(keys.SCALED_TO_ZERO, name)
            self._redis.hdel(keys.DEGRADED, name)
            self._redis.hdel(keys.WAKE, name)
            self._redis.delete(
                keys.pipeline_versions(name), keys.canary(name), keys.canary_figures(name)
            )
            from eventbus.serving._replica_figures import clear_stats

            clear_stats(self._redis, name)

    def restore(self) -> list[str]:
        """Reconcile Ray to the stored state: recreate missing topics, applications, hosts
        and source actors (a pipeline at zero stays without its application)."""
        restored = []
        records = {n: json.loads(r) for n, r in self._redis.hgetall(keys.PIPELINES).items()}
        from eventbus.serving._placement import live_nodes, placement_problems

        for rec in records.values():
            config = PipelineConfig.model_validate(rec["document"])
            if config.spec.serving.placement is not None:
                # Serve would wait forever for replicas no live node can take, and this
                # controller with it: such a pipeline waits for a redeploy, said so in the log
                misplaced = placement_problems(config.spec.serving, live_nodes())
                if misplaced:
                    log.warning("pipeline %r not restored: %s", config.name, "; ".join(misplaced))
                    continue
            try:
                with self.locks.of(config.name):
                    create_missing_topics(config, self.kafka_bootstrap, self.kafka_client)
                    self._ensure(config, rec["python_path"])
                    self.scaler.track(config)
                restored.append(config.name)
            except Exception:
                log.exception("could not restore pipeline %r", config.name)
        try:
            from ray import serve

            self.apps.hosts.ensure(set(serve.status().applications), records)
        except Exception:
            log.exception("could not restore the shared hosts")
        if self.apps.pace.started:
            self.apps.pace.settle()  # every pipeline at zero (or none): Serve idles
        return restored

    def _ensure(self, config: PipelineConfig, python_path: list[str]) -> None:
        apps = self.apps.running()
        with self._models_lock:
            self.models.ensure_apps(config, running=apps)
        # a pipeline at zero has no application on purpose: the watcher runs it on lag
        at_zero = bool(self._redis.hexists(keys.SCALED_TO_ZERO, config.name))
        if config.spec.serving.host is not None:
            return  # its host runs it (restore() reconciles the hosts)
        from eventbus.serving._deployment import app_name

        if app_name(config.name) not in apps and not at_zero:
            self.apps.run(config, python_path)
        ensure_sources(config, self.apps.runtime(run_sources=False))

    def _ensure_models(self, config: PipelineConfig) -> None:
        with self.apps.pace.running(), self._models_lock:
            self.models.ensure_apps(config, running=self.apps.running())
