"""The controller: desired state (pipelines) in Redis, reconciled to Ray Serve and source actors.

It runs as one detached Ray actor (``eventbus-controller`` in namespace ``eventbus``), like
Ray Serve's own controller; its state survives it in Redis, and on (re)start it adopts the
running Serve applications and source actors or recreates the missing ones.
"""

from __future__ import annotations

import builtins  # `Controller.list` shadows `list` in the annotations after it
import json
import logging
import threading
import time
import uuid
from typing import Any

import ray

from eventbus._internal import keys
from eventbus._internal.redis_client import connect
from eventbus.errors import DeployError, PipelineNotFoundError
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._loader import load_pipeline_text
from eventbus.serving._bridge import bridged_groups, broker_holds_joins, open_bridges
from eventbus.serving._deployment import app_name, build_app
from eventbus.serving._host import serving_app

__all__ = ["CONTROLLER_NAME", "NAMESPACE", "Controller", "source_actor_name"]

log = logging.getLogger("eventbus.serving.controller")

NAMESPACE = "eventbus"
CONTROLLER_NAME = "eventbus-controller"
#: Versions kept per pipeline (the oldest are forgotten).
KEEP_VERSIONS = 20


def source_actor_name(pipeline: str, index: int) -> str:
    """The Ray actor name of a pipeline's source."""
    return f"eventbus-source-{pipeline}-{index}"


class Controller:
    """Deploys, updates and deletes pipelines; persists them in Redis.

    Args:
        kafka_bootstrap: default Kafka bootstrap address for sources and sinks.
        redis_url: where the desired state lives.
        kafka_client: the stack's Kafka connection settings (a :class:`KafkaClientConfig` as a
            dict: TLS files and secret references, never secrets); None: plaintext.
    """

    def __init__(
        self, kafka_bootstrap: str, redis_url: str, kafka_client: dict[str, Any] | None = None
    ) -> None:
        self.kafka_bootstrap = kafka_bootstrap
        self.kafka_client_doc = kafka_client
        self.kafka_client = KafkaClientConfig.model_validate(kafka_client) if kafka_client else None
        self.redis_url = redis_url
        self._redis = connect(redis_url, decode_responses=True)
        self._serve_started = False
        self._serve_idle: bool | None = None  # Serve's loop at its idle pace (None: unknown)
        from eventbus.serving._models import ModelControl

        self.models = ModelControl(redis_url)
        # Deploys come from callers and from the canary loop's promotions: one at a time.
        self._lock = threading.RLock()
        self._woken_at: dict[str, float] = {}  # pipeline -> when wake() had it running again
        from eventbus.serving._scale_to_zero import ScaleToZero

        # one watcher for every `replicas.min: 0` pipeline (see _scale_to_zero)
        self.scaler = ScaleToZero(self._redis, self._scale, kafka_bootstrap, self.kafka_client)
        from eventbus.serving._doorbell import Ringer

        # rings the replicas' idle (parked) sources when records arrive (see _doorbell)
        # (and nudges the watcher when records wait for a pipeline at zero)
        self.ringer = Ringer(self._redis, kafka_bootstrap, self.kafka_client, zero=self.scaler)
        # whether woken pipelines bridge their group joins (Tansu holds them; see _bridge):
        # asked now, off the first wake-up's path (a wake-up asks again if this failed)
        threading.Thread(
            target=broker_holds_joins,
            args=(kafka_bootstrap, self.kafka_client),
            name="eventbus-broker-kind",
            daemon=True,
        ).start()
        from eventbus.serving._host_control import Hosts

        # pipelines sharing a host's replicas (serving.host; see _host)
        self.hosts = Hosts(self._redis, self._runtime(run_sources=True))
        from eventbus.serving._topics import TopicWatch

        # marks the pipelines whose topics were deleted under them DEGRADED (see _topics)
        self.topic_watch = TopicWatch(self._redis, kafka_bootstrap, self.kafka_client)
        self.restore()
        self.scaler.start()
        self.ringer.start()
        self.topic_watch.start()
        threading.Thread(target=self._canary_loop, name="eventbus-canary", daemon=True).start()

    # -- public operations --------------------------------------------------------------------
    def deploy(
        self, text: str, filename: str, python_path: list[str], *, rollback_of: int | None = None
    ) -> dict[str, Any]:
        """Validate and deploy (or redeploy) a pipeline; a canary of it that is running ends.

        Raises:
            PipelineConfigError: the YAML has problems (nothing is deployed).
            DeployError: the Serve application or a source could not start.
        """
        with self._lock:
            info = self._deploy(text, filename, python_path, rollback_of=rollback_of)
            self._end_canary(info["name"], "superseded", f"version {info['version']} was deployed")
            return info

    def _deploy(
        self, text: str, filename: str, python_path: list[str], *, rollback_of: int | None = None
    ) -> dict[str, Any]:
        """Validate and deploy (or redeploy) a pipeline from its YAML text.

        Raises:
            PipelineConfigError: the YAML has problems (nothing is deployed).
            DeployError: the Serve application or a source could not start.
        """
        config = load_pipeline_text(text, filename, check_functions=False)
        name = config.name
        self._check_chained(config)
        from eventbus.serving._topics import check_topics

        # every Kafka topic exists, or carries `create:` and is created now (else refused)
        check_topics(config, self.kafka_bootstrap, self.kafka_client)
        previous = self._load(name)
        version = (previous["version"] + 1) if previous else 1
        self._stop_sources(name, _consumed(previous["document"]) if previous else 0)
        try:
            self._create_ingress_topic(config)
            self._ensure_models(config)
            self._run_app(config, python_path)
            self._start_sources(config)
        except Exception as exc:  # noqa: BLE001 - undone, then raised as a DeployError
            self._stop_sources(name, len(config.consumed_sources))
            if previous is not None:  # put the last good version back
                old = PipelineConfig.model_validate(previous["document"])
                try:
                    self._run_app(old, previous["python_path"])
                    self._start_sources(old)
                except Exception:
                    log.exception(
                        "restoring pipeline %r version %s failed", name, previous["version"]
                    )
            else:
                self._delete_app(name)
            msg = f"pipeline {name!r} could not be deployed: {_root_cause(exc)}"
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
        versions_key = keys.pipeline_versions(name)
        self.scaler.track(config)  # a deploy runs replicas: the idle time starts again
        with self._redis.pipeline(transaction=True) as tx:
            tx.hdel(keys.SCALED_TO_ZERO, name)
            tx.hdel(keys.DEGRADED, name)  # its topics were just checked
            tx.hset(keys.PIPELINES, name, json.dumps(record))
            tx.incr(keys.PIPELINES_VERSION)
            tx.hset(versions_key, str(version), json.dumps(record))
            tx.hdel(
                versions_key,
                *[
                    str(v)
                    for v in range(max(1, version - 2 * KEEP_VERSIONS), version - KEEP_VERSIONS + 1)
                ]
                or ["0"],
            )
            tx.execute()
        info: dict[str, Any] = {
            "name": name,
            "version": version,
            "sources": len(config.spec.sources),
            "steps": len(config.spec.steps),
        }
        if rollback_of is not None:
            info["rollback_of"] = rollback_of
        return info

    def versions(self, name: str) -> list[dict[str, Any]]:
        """The kept versions of a pipeline, newest first: version, deploy time, file, whether
        it serves now, and which version a rollback restored.

        Raises:
            PipelineNotFoundError: no pipeline of that name is deployed.
        """
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

    # -- canary upgrades (eventbus.serving._canary) ------------------------------------------------
    def deploy_canary(
        self,
        text: str,
        filename: str,
        python_path: list[str],
        *,
        weights: list[int] | None = None,
        step_s: float = 30.0,
        min_events: int = 20,
    ) -> dict[str, Any]:
        """Start a canary: the new version's steps take ``weights[0]`` % of the events, then
        each next weight after ``step_s`` without a regression; after the last (100) it is
        promoted (an ordinary deploy). A regression rolls it back at once.

        Raises:
            PipelineConfigError: the YAML has problems.
            PipelineNotFoundError: the pipeline is not deployed (deploy it first).
            DeployError: more than the steps differ, nothing differs, or a canary is running.
        """
        weights = list(weights or [10, 50, 100])
        if (
            not weights
            or any(not 0 < w <= 100 for w in weights)
            or weights != sorted(weights)
            or weights[-1] != 100
        ):
            msg = f"canary weights must rise from above 0 to 100 (percent), e.g. 10,50,100; got {weights}"
            raise DeployError(msg)
        config = load_pipeline_text(text, filename, check_functions=False)
        name = config.name
        with self._lock:
            current = self.get(name)
            old = PipelineConfig.model_validate(current["document"])
            differ = [
                k
                for k in old.spec.model_fields
                if k != "steps" and getattr(old.spec, k) != getattr(config.spec, k)
            ]
            if differ:
                msg = f"a canary of {name!r} may change its steps only, and {', '.join(differ)} differ; deploy it without --canary"
                raise DeployError(msg)
            if old.spec.steps == config.spec.steps:
                msg = f"the canary's steps are those of {name!r} version {current['version']}; there is nothing to compare"
                raise DeployError(msg)
            running = self.canary_status(name)
            if running is not None and running["status"] == "running":
                msg = f"a canary of {name!r} is running (at {running['weight']}%); `eventbus promote {name}` or `eventbus rollback {name}` first"
                raise DeployError(msg)
            state = {
                "id": uuid.uuid4().hex[:12],
                "name": name,
                "version": current["version"] + 1,
                "yaml": text,
                "filename": filename,
                "python_path": python_path,
                "document": config.to_document(),
                "weights": weights,
                "step": 0,
                "weight": weights[0],
                "step_s": step_s,
                "min_events": min_events,
                "status": "running",
                "started_at": time.time(),
                "step_started_at": time.time(),
                "baseline": None,
                "history": [],
                "reason": "",
            }
            self._redis.set(keys.canary(name), json.dumps(state))
        return {
            "name": name,
            "canary_version": state["version"],
            "weight": weights[0],
            "weights": weights,
        }

    def canary_status(self, name: str) -> dict[str, Any] | None:
        """The pipeline's canary (running or how the last one ended), or None."""
        raw = self._redis.get(keys.canary(name))
        if not raw:
            return None
        state = json.loads(raw)
        return {
            k: v
            for k, v in state.items()
            if k not in ("yaml", "document", "python_path", "baseline")
        }

    def promote(self, name: str) -> dict[str, Any]:
        """Deploy the running canary as the serving version now.

        Raises:
            PipelineNotFoundError: no canary of that pipeline is running.
        """
        with self._lock:
            state = self._running_canary(name)
            return self._promote(state, "promoted by request")

    def _running_canary(self, name: str) -> dict[str, Any]:
        raw = self._redis.get(keys.canary(name))
        state: dict[str, Any] | None = json.loads(raw) if raw else None
        if state is None or state["status"] != "running":
            msg = f"no canary of {name!r} is running; start one with `eventbus deploy FILE --canary 10`"
            raise PipelineNotFoundError(msg)
        return state

    def _promote(self, state: dict[str, Any], reason: str) -> dict[str, Any]:
        info = self._deploy(state["yaml"], state["filename"], state["python_path"])
        self._end_canary(state["name"], "promoted", reason, version=info["version"])
        return {**info, "promoted": True}

    def _end_canary(self, name: str, status: str, reason: str, **extra: Any) -> None:
        key = keys.canary(name)
        raw = self._redis.get(key)
        if not raw:
            return
        state = json.loads(raw)
        if state["status"] != "running":
            return
        state.update(status=status, reason=reason, ended_at=time.time(), weight=0, **extra)
        log.info("canary of %r %s: %s", name, status, reason)
        with self._redis.pipeline(transaction=True) as tx:
            tx.set(key, json.dumps(state), ex=7 * 86400)
            tx.delete(keys.canary_figures(name))
            tx.execute()

    def _canary_loop(self) -> None:
        """Judge every running canary about once a second (the controller's own timer)."""
        while True:
            time.sleep(1.0)
            try:
                # one SCAN round trip per 1,000 keys, not per 10 (Redis's default COUNT): the
                # keyspace grows with pipelines (stats, history buckets), and this runs every
                # second (600 keys: 2.5 ms of CPU a look with the default, 0.06 ms with 1,000)
                canaries = self._redis.scan_iter(keys.CANARY_PATTERN, count=1000)
                names = [keys.canary_pipeline(k) for k in canaries]
            except Exception:  # noqa: BLE001 - Redis away: try again next tick
                log.warning("canary loop: Redis did not answer")
                continue
            for name in names:
                try:
                    with self._lock:
                        self._canary_tick(name)
                except Exception:
                    log.exception("canary of %r: tick failed", name)

    def _canary_tick(self, name: str) -> None:
        from eventbus.serving._canary import judge, sum_figures

        key = keys.canary(name)
        raw = self._redis.get(key)
        state = json.loads(raw) if raw else None
        if state is None or state["status"] != "running":
            return
        figures = sum_figures(self._redis.hgetall(keys.canary_figures(name)), state["id"])
        if state["baseline"] is None:
            state["baseline"] = figures
            self._redis.set(key, json.dumps(state))
            return
        base = state["baseline"]
        delta = {v: {k: figures[v][k] - base[v][k] for k in figures[v]} for v in figures}
        verdict = judge(
            delta,
            elapsed_s=time.time() - state["step_started_at"],
            step_s=state["step_s"],
            min_events=state["min_events"],
        )
        if verdict.action == "wait":
            return
        state["history"].append(
            {
                "weight": state["weight"],
                "figures": delta,
                "verdict": verdict.action,
                "reason": verdict.reason,
            }
        )
        if verdict.action == "rollback":
            self._redis.set(key, json.dumps(state))
            self._end_canary(name, "rolled_back", f"at {state['weight']}%: {verdict.reason}")
            return
        if state["step"] + 1 >= len(state["weights"]):
            self._redis.set(key, json.dumps(state))
            self._promote(
                state, f"passed every step ({', '.join(f'{w}%' for w in state['weights'])})"
            )
            return
        state["step"] += 1
        state["weight"] = state["weights"][state["step"]]
        state["step_started_at"] = time.time()
        state["baseline"] = figures
        self._redis.set(key, json.dumps(state))
        log.info("canary of %r: %s%% of the events (%s)", name, state["weight"], verdict.reason)

    def rollback(self, name: str, version: int | None = None) -> dict[str, Any]:
        """End the running canary, if any (nothing else changes); otherwise deploy an earlier
        version's YAML again, as a new version (like ``helm rollback``).

        Args:
            version: the version to restore; None: the one before the serving version.

        Raises:
            PipelineNotFoundError: no such pipeline, or no such kept version.
            DeployError: the deployment failed (the serving version stays).
        """
        with self._lock:
            canary = self.canary_status(name)
            if canary is not None and canary["status"] == "running" and version is None:
                self._end_canary(name, "rolled_back", "by request")
                return {
                    "name": name,
                    "version": self.get(name)["version"],
                    "canary_rolled_back": canary["version"],
                }
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
        rec = json.loads(kept[version])
        return self.deploy(rec["yaml"], rec["filename"], rec["python_path"], rollback_of=version)

    def delete(self, name: str) -> None:
        """Drain the sources, delete the Serve application and forget the pipeline.

        Raises:
            PipelineNotFoundError: no pipeline of that name is deployed.
        """
        # under the lock: not across a deploy or a scale-to-zero action (a serve.run of
        # an application being deleted waits for it forever)
        with self._lock:
            record = self._load(name)
            if record is None:
                msg = f"no pipeline named {name!r} is deployed; `eventbus list` shows the deployed ones"
                raise PipelineNotFoundError(msg)
            self._stop_sources(name, _consumed(record["document"]))
            self._delete_app(name)
            try:
                self.models.release(
                    name,
                    [
                        json.loads(r)["document"]
                        for r in self._redis.hgetall(keys.PIPELINES).values()
                    ],
                )
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
                keys.pipeline_versions(name),
                keys.canary(name),
                keys.canary_figures(name),
            )
            from eventbus.serving._replica_sources import clear_stats

            clear_stats(self._redis, name)

    def list(self) -> list[dict[str, Any]]:
        """Every deployed pipeline: name, version, deploy time, Serve status."""
        from ray import serve

        statuses: dict[str, str] = {}
        try:
            for app, st in serve.status().applications.items():
                statuses[app] = str(st.status.value if hasattr(st.status, "value") else st.status)
        except Exception:  # noqa: BLE001, S110 - Serve not started yet
            pass
        from eventbus.serving._scale_to_zero import SCALED_TO_ZERO

        zero = self._redis.hgetall(keys.SCALED_TO_ZERO)
        degraded = self._redis.hgetall(keys.DEGRADED)
        out = []
        for raw in self._redis.hgetall(keys.PIPELINES).values():
            rec = json.loads(raw)
            status = statuses.get(serving_app(rec["document"]), "MISSING")
            if status == "RUNNING" and rec["name"] in degraded:
                status = "DEGRADED"  # a topic of it is gone (see _topics)
            out.append(
                {
                    "name": rec["name"],
                    "version": rec["version"],
                    "deployed_at": rec["deployed_at"],
                    # at zero Serve says RUNNING (zero of zero replicas): not failed, idle
                    "status": SCALED_TO_ZERO if rec["name"] in zero else status,
                    "sources": len(rec["document"]["spec"]["sources"]),
                    "steps": len(rec["document"]["spec"].get("steps", [])),
                }
            )
        return sorted(out, key=lambda r: r["name"])

    def get(self, name: str) -> dict[str, Any]:
        """The stored record of a pipeline (document, YAML, version)."""
        record = self._load(name)
        if record is None:
            msg = f"no pipeline named {name!r} is deployed; `eventbus list` shows the deployed ones"
            raise PipelineNotFoundError(msg)
        return record

    def status(self, name: str) -> dict[str, Any]:
        """A pipeline's record plus live source counters."""
        record = self.get(name)
        config = PipelineConfig.model_validate(record["document"])
        if config.spec.serving.source_placement == "replica":
            from eventbus.serving._replica_sources import read_stats

            stats = read_stats(self._redis, name, len(config.consumed_sources))
            from eventbus.observability._view import mark_degraded, pipeline_view

            raw = list(self._redis.hgetall(keys.stats(name)).values())
            figures = pipeline_view(
                record,
                raw,
                [list(s.topics) for s in config.consumed_sources],
                scale=self.scaler.state(name),
            )
            mark_degraded(figures, self._redis.hget(keys.DEGRADED, name))
            return {
                "name": name,
                "version": record["version"],
                "state": figures["state"],
                "sources": stats,
                "figures": figures,
            }
        sources: builtins.list[dict[str, Any]] = []
        for i in range(_consumed(record["document"])):
            try:
                # Any: SourceActor's methods are not @ray.method (no typed `.remote`).
                actor: Any = ray.get_actor(source_actor_name(name, i), namespace=NAMESPACE)
                sources.append(ray.get(actor.stats.remote(), timeout=10))
            except Exception as exc:  # noqa: BLE001
                sources.append({"error": f"{type(exc).__name__}: {exc}"})
        from eventbus.observability._view import mark_degraded, pipeline_view

        raw = list(self._redis.hgetall(keys.stats(name)).values())
        figures = pipeline_view(
            record,
            raw,
            [list(s.topics) for s in config.consumed_sources],
            scale=self.scaler.state(name),
        )
        mark_degraded(figures, self._redis.hget(keys.DEGRADED, name))
        return {
            "name": name,
            "version": record["version"],
            "state": figures["state"],
            "sources": sources,
            "figures": figures,
        }

    def restore(self) -> builtins.list[str]:
        """Reconcile Ray to the stored state: recreate missing apps and source actors."""
        restored = []
        records = {n: json.loads(r) for n, r in self._redis.hgetall(keys.PIPELINES).items()}
        for rec in records.values():
            config = PipelineConfig.model_validate(rec["document"])
            try:
                self._create_missing_topics(config)
                self._ensure(config, rec["python_path"])
                self.scaler.track(config)
                restored.append(config.name)
            except Exception:
                log.exception("could not restore pipeline %r", config.name)
        try:
            from ray import serve

            self.hosts.ensure(set(serve.status().applications), records)
        except Exception:
            log.exception("could not restore the shared hosts")
        if self._serve_started:
            self._pace_serve(idle=True)  # every pipeline at zero (or none): Serve idles
        return restored

    def wake(self, name: str) -> bool:
        """Run a pipeline scaled to zero again now, and start its idle time afresh (replay and
        redrive call its replicas directly: no lag or sync call wakes it). False: it was not
        at zero.

        Raises:
            PipelineNotFoundError: no pipeline of that name is deployed.
        """
        config = PipelineConfig.model_validate(self.get(name)["document"])
        if not self._redis.hexists(keys.SCALED_TO_ZERO, name):
            return False
        self.scaler.track(config)
        self._scale(name, False, time.time(), "call")
        # idle time counts from the replica being up, not from the start of its cold start
        # (a short idle_s could otherwise send it back to zero as the wake returns)
        self._woken_at[name] = time.time()
        self.scaler.track(config)
        return True

    def ping(self) -> str:
        """Liveness check."""
        return "ok"

    # -- models (eventbus.serving._models) --------------------------------------------------------
    def push_model(self, name: str, blob: bytes, options: dict[str, Any]) -> dict[str, Any]:
        """Add a model version, validate it and swap it in (``ModelControl.push`` options).

        Raises:
            ModelError: the artifact does not load. ModelValidationError: it was rejected.
        """
        self._start_serve()
        return self.models.push(name, blob, **options)

    def list_models(self, name: str | None = None) -> builtins.list[dict[str, Any]]:
        """Every model version: status, traffic share."""
        return self.models.list(name)

    def split_model(self, name: str, version: int | None, weight: float) -> dict[str, Any]:
        """Send ``weight`` of a model's traffic to ``version`` (None: end the split)."""
        self._start_serve()
        return self.models.split(name, version, weight)

    def _ensure_models(self, config: PipelineConfig) -> None:
        from ray import serve

        self._start_serve()
        self.models.ensure_apps(config, running=set(serve.status().applications))

    # -- internals ----------------------------------------------------------------------------
    def _load(self, name: str) -> dict[str, Any] | None:
        raw = self._redis.hget(keys.PIPELINES, name)
        return json.loads(raw) if raw else None

    def _start_serve(self) -> None:
        if not self._serve_started:
            from ray import serve

            serve.start(
                proxy_location="Disabled",
                logging_config={"log_level": "WARNING", "enable_access_log": False},
            )
            self._serve_started = True
        self._pace_serve(idle=False)  # an application is about to run: Serve's usual pace

    def _create_missing_topics(self, config: PipelineConfig) -> None:
        """Before a restore: a broker that restarted without storage (the embedded one keeps
        topics in memory) lost the pipeline's topics, which existed (or were created) at its
        deploy; create the missing ones (``create:``'s partitions, else one per replica, at
        least 2)."""
        import asyncio

        from eventbus._internal.services import create_topics
        from eventbus.serving._topics import kafka_topics

        default = max(2, config.spec.serving.replica_bounds.max)
        for bootstrap, cluster in kafka_topics(
            config, self.kafka_bootstrap, self.kafka_client
        ).items():
            by_count: dict[int, list[str]] = {}  # one admin call per partition count
            for _, topic, create in cluster.topics:
                by_count.setdefault((create.partitions if create else None) or default, []).append(
                    topic
                )
            for partitions, topics in by_count.items():
                asyncio.run(create_topics(bootstrap, topics, partitions, client=cluster.client))
        self._create_ingress_topic(config)

    def _check_chained(self, config: PipelineConfig) -> None:
        """Every ``pipeline:`` sink names a deployed pipeline that consumes its ingress topic.

        Raises:
            DeployError: naming the sink, the pipeline and the fix (nothing is deployed).
        """
        from eventbus.registry import sources

        for path, sink in config.spec.output_paths().items():
            if sink.kind != "pipeline":
                continue
            target = sink.options.name
            record = self._load(target)
            if record is None:
                deployed = ", ".join(sorted(self._redis.hkeys(keys.PIPELINES))) or "none"
                msg = (
                    f"pipeline {config.name!r} could not be deployed: spec.{path}.pipeline names "
                    f"pipeline {target!r}, which is not deployed (deployed: {deployed}); deploy "
                    f"{target!r} first, or fix the name"
                )
                raise DeployError(msg)
            kinds = [next(iter(s)) for s in record["document"]["spec"]["sources"]]
            if not any(sources.get(k).trait("ingress") for k in kinds if k in sources):
                msg = (
                    f"pipeline {config.name!r} could not be deployed: spec.{path}.pipeline names "
                    f"pipeline {target!r}, which has no http, grpc or pipeline source, so nothing "
                    f"consumes what is sent to it; add '- pipeline: {{}}' to the sources of {target!r}"
                )
                raise DeployError(msg)

    def _create_ingress_topic(self, config: PipelineConfig) -> None:
        """Create the topic the gateway writes the pipeline's HTTP/gRPC events to, with one
        partition per replica it may have (so every replica consumes), and at least one per
        gateway producer (each writes its own partitions)."""
        import asyncio

        from eventbus._internal.services import create_topics
        from eventbus.eventing.sources._http_config import GATEWAY_PRODUCERS, ingress_topic
        from eventbus.registry import sources

        if not any(sources.get(s.kind).trait("ingress") for s in config.spec.sources):
            return
        partitions = max(GATEWAY_PRODUCERS, config.spec.serving.replica_bounds.max)
        asyncio.run(
            create_topics(
                self.kafka_bootstrap,
                [ingress_topic(config.name)],
                partitions,
                client=self.kafka_client,
            )
        )

    def _scale(self, name: str, zero: bool, last_event_at: float, woken_by: str = "poll") -> None:
        """Scale a ``min: 0`` pipeline's replicas to zero, or back to its configured count
        (the scale-to-zero watcher's decision), and record it (a wake-up with who saw its
        events: ``woken_by``)."""
        with self._lock:  # not across a deploy, which runs replicas and clears the record
            record = self._load(name)
            if record is None:
                return  # deleted meanwhile
            config = PipelineConfig.model_validate(record["document"])
            bounds = config.spec.serving.replica_bounds
            if not bounds.scale_to_zero:
                return  # redeployed without min 0 meanwhile
            at_zero = bool(self._redis.hexists(keys.SCALED_TO_ZERO, name))
            if zero == at_zero:
                return
            woken_at = self._woken_at.pop(name, None) if zero else None
            if woken_at is not None and time.time() - woken_at < bounds.idle_s:
                # decided on an idle time that began before a wake's cold start ended
                self._woken_at[name] = woken_at
                return
            if zero:  # recorded first: a gateway that sees it waits for the wake-up
                state = {"since": time.time(), "last_event_at": last_event_at}
                self._redis.hset(keys.SCALED_TO_ZERO, name, json.dumps(state))
            else:  # when the wake-up began (a cold start's breakdown reads it)
                raw = self._redis.hget(keys.SCALED_TO_ZERO, name)
                woken = {
                    **(json.loads(raw) if raw else {}),
                    "waking_at": time.time(),
                    "woken_by": woken_by,
                }
                self._redis.hset(keys.SCALED_TO_ZERO, name, json.dumps(woken))
            if zero:
                # The Serve application goes, not just its replicas: Serve's controller spends
                # CPU on every application it holds at every control loop, replicas or none
                # (50 applications at zero: ~5.6% of a core). The pipeline's record stays in
                # Redis; waking runs the application again. Blocking: the replica's drain and
                # commit end first (a serve.run of an application being deleted never returns).
                self._delete_app(name)
                # when the replicas had drained and the application was gone (the lock is
                # held until then: a wake-up of another pipeline waits for it)
                settled = {**state, "settled_at": time.time()}
                self._redis.hset(keys.SCALED_TO_ZERO, name, json.dumps(settled))
            else:
                # no member is live in the pipeline's groups: its first replica's sources may
                # consume by assignment while they join, where the broker holds a first join
                # (Tansu: half the session timeout; Apache Kafka answers at once)
                groups = bridged_groups(config, self.kafka_bootstrap).values()
                if groups and broker_holds_joins(self.kafka_bootstrap, self.kafka_client):
                    open_bridges(self._redis, groups)
                self._run_app(config, record["python_path"])
                self._redis.hdel(keys.SCALED_TO_ZERO, name)

    def _runtime(self, *, run_sources: bool) -> dict[str, Any]:
        return {
            "run_sources": run_sources,
            "kafka_bootstrap": self.kafka_bootstrap,
            "kafka_client": self.kafka_client_doc,
            "redis_url": self.redis_url,
        }

    def _run_app(self, config: PipelineConfig, python_path: builtins.list[str]) -> None:
        from ray import serve

        self._start_serve()
        if config.spec.serving.host is not None:  # on its shared host, not an app of its own
            self.hosts.join(config, python_path)
            if app_name(config.name) in serve.status().applications:
                self._delete_app(config.name, own_only=True)  # it moved onto the host
            return
        self.hosts.leave(config.name)  # it moved off a shared host
        runtime = self._runtime(run_sources=config.spec.serving.source_placement == "replica")
        try:
            serve.run(
                build_app(config, python_path, runtime),
                name=app_name(config.name),
                route_prefix=None,
            )
        except RuntimeError as e:  # Serve's message names the deployment, not why it failed
            raise RuntimeError(_deployment_failure(app_name(config.name)) or str(e)) from e

    def _delete_app(self, name: str, *, own_only: bool = False) -> None:
        from ray import serve

        if not own_only and self.hosts.leave(name):
            self._pace_serve(idle=True)  # the host's last member: its application went too
            return  # a host member: drained off its host, the other members untouched
        try:
            serve.delete(app_name(name))
        except Exception:
            log.exception("deleting the Serve application of %r failed", name)
        self._pace_serve(idle=True)

    def _pace_serve(self, *, idle: bool) -> None:
        """Serve's control loop slow while no application runs on it, at its pace before
        one runs (``_serve_pace``): idle only once the last application is gone."""
        if idle == self._serve_idle:
            return
        try:
            if idle:
                from ray import serve

                if serve.status().applications:
                    return
            from eventbus.serving._serve_pace import set_serve_pace

            answer = set_serve_pace(idle)
            self._serve_idle = idle if answer != "unsupported" else None
        except Exception as e:  # noqa: BLE001 - only Serve's pace: it keeps its own
            log.warning("setting Serve's control loop pace failed (%s)", e)
            self._serve_idle = None

    def _start_sources(self, config: PipelineConfig) -> None:
        from eventbus.serving._source_actor import SourceActor

        if config.spec.serving.source_placement != "actor":
            return  # the replicas consume

        actors = []
        for i in range(len(config.consumed_sources)):
            actor = SourceActor.options(  # type: ignore[attr-defined]
                name=source_actor_name(config.name, i), namespace=NAMESPACE, lifetime="detached"
            ).remote(
                config.to_document(),
                i,
                app_name(config.name),
                self.kafka_bootstrap,
                self.redis_url,
                self.kafka_client_doc,
            )
            actors.append(actor)
        for i, actor in enumerate(actors):
            if not ray.get(actor.ready.remote(60.0), timeout=90):
                msg = f"source {i} of pipeline {config.name!r} did not start within 60 s"
                raise DeployError(msg)

    def _stop_sources(self, name: str, count: int) -> None:
        for i in range(count):
            try:
                actor = ray.get_actor(source_actor_name(name, i), namespace=NAMESPACE)
            except ValueError:
                continue
            try:
                ray.get(actor.stop.remote(True), timeout=60)
            except Exception:
                log.exception("draining source %d of %r failed", i, name)
            ray.kill(actor, no_restart=True)
            _wait_gone(source_actor_name(name, i))

    def _ensure(self, config: PipelineConfig, python_path: builtins.list[str]) -> None:
        from ray import serve

        self._start_serve()
        apps = serve.status().applications
        self.models.ensure_apps(config, running=set(apps))
        # a pipeline at zero has no application on purpose: the watcher runs it on lag
        at_zero = bool(self._redis.hexists(keys.SCALED_TO_ZERO, config.name))
        if config.spec.serving.host is not None:
            return  # its host runs it (restore() reconciles the hosts)
        if app_name(config.name) not in apps and not at_zero:
            self._run_app(config, python_path)
        if config.spec.serving.source_placement != "actor":
            return
        for i in range(len(config.consumed_sources)):
            try:
                ray.get_actor(source_actor_name(config.name, i), namespace=NAMESPACE)
            except ValueError:
                self._start_sources(config)
                break


def _consumed(document: dict[str, Any]) -> int:
    return len(PipelineConfig.model_validate(document).consumed_sources)


def _wait_gone(actor_name: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(actor_name, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.05)


def _deployment_failure(app: str) -> str | None:
    """The error a failed deployment of ``app`` recorded (a replica's constructor traceback:
    a source refused by the broker, say), which Serve's application message leaves out."""
    from ray import serve

    try:
        status = serve.status().applications.get(app)
    except Exception:  # noqa: BLE001 - only a better message; Serve's own stands without it
        return None
    if status is None:
        return None
    failed = [d.message for d in status.deployments.values() if d.status != "HEALTHY"]
    return next((m for m in failed if m), None)


def _root_cause(exc: BaseException) -> str:
    text = str(exc)
    # Serve wraps replica constructor failures in long tracebacks; keep the last line.
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__
