"""The controller: desired state (pipelines) in Redis, reconciled to Ray Serve and source actors.

It runs as one detached Ray actor (``eventbus-controller`` in namespace ``eventbus``), like
Ray Serve's own controller; its state survives it in Redis, and on (re)start it adopts the
running Serve applications and source actors or recreates the missing ones.

:class:`Controller` is the actor's interface; the work is done by reconcilers, each of one
concern, sharing one lock per pipeline (``_locks``):

* ``_deploys.Deploys``: deploy, redeploy, versions, rollback, delete, restore;
* ``_scaling.Scaling``: scale to zero and back (its watcher is ``_scale_to_zero``), wake-ups;
* ``_canaries.Canaries``: start, judge, advance, promote, roll back canaries;
* ``_host_control.Hosts``: shared hosts' membership (through ``_serve_apps.ServeApps``,
  the Serve side every reconciler runs and deletes applications through);
* ``_models.ModelControl``: model versions and their applications.
"""

from __future__ import annotations

import builtins  # `Controller.list` shadows `list` in the annotations after it
import functools
import threading
from typing import Any

from eventbus._internal.redis_client import connect
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._loader import load_pipeline_text
from eventbus.serving._bridge import broker_holds_joins
from eventbus.serving._canaries import Canaries
from eventbus.serving._deploys import Deploys, load_record
from eventbus.serving._locks import PipelineLocks
from eventbus.serving._scaling import Scaling
from eventbus.serving._serve_apps import ServeApps
from eventbus.serving._source_actors import NAMESPACE, source_actor_name
from eventbus.serving._views import pipeline_list, pipeline_status

__all__ = ["CONTROLLER_NAME", "NAMESPACE", "Controller", "source_actor_name"]

CONTROLLER_NAME = "eventbus-controller"


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
        self.kafka_client = KafkaClientConfig.model_validate(kafka_client) if kafka_client else None
        self.redis_url = redis_url
        self._redis = connect(redis_url, decode_responses=True)
        from eventbus._internal.secret_store import configure as configure_secrets

        configure_secrets(redis_url)  # {secret: NAME} of the stack's Kafka client settings
        from eventbus.serving._models import ModelControl

        self.models = ModelControl(redis_url)
        # one lock per pipeline: a change of one never waits behind another's (see _locks)
        self.locks = PipelineLocks()
        self.apps = ServeApps(self._redis, kafka_bootstrap, kafka_client, redis_url)
        self.hosts = self.apps.hosts  # pipelines sharing a host's replicas (serving.host)
        self.scaling = Scaling(
            self._redis,
            self.apps,
            self.locks,
            functools.partial(load_record, self._redis),
            kafka_bootstrap,
            self.kafka_client,
        )
        self.scaler = self.scaling.watcher
        self.deploys = Deploys(
            self._redis,
            self.apps,
            self.models,
            self.scaler,
            self.locks,
            kafka_bootstrap,
            self.kafka_client,
        )
        self.canaries = Canaries(self._redis, self.locks, self.deploys.get, self._deploy_text)
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
        from eventbus.serving._topic_checks import TopicWatch

        # marks the pipelines whose topics were deleted under them DEGRADED (_topic_checks)
        self.topic_watch = TopicWatch(self._redis, kafka_bootstrap, self.kafka_client)
        self.restore()
        self.scaler.start()
        self.models.zero.start()  # model applications with idle_s (_model_zero)
        self.ringer.start()
        self.topic_watch.start()
        threading.Thread(
            target=self.canaries.run_forever, name="eventbus-canary", daemon=True
        ).start()

    # -- pipelines (eventbus.serving._deploys) ------------------------------------------------
    def deploy(
        self, text: str, filename: str, python_path: list[str], *, rollback_of: int | None = None
    ) -> dict[str, Any]:
        """Validate and deploy (or redeploy) a pipeline; a canary of it that is running ends.

        Raises:
            PipelineConfigError: the YAML has problems (nothing is deployed).
            DeployError: the Serve application or a source could not start.
        """
        config = load_pipeline_text(
            text, filename, check_functions=False, base_dir=python_path[0] if python_path else ""
        )
        with self.locks.of(config.name):
            info = self.deploys.apply(config, text, filename, python_path, rollback_of=rollback_of)
            self.canaries.end(config.name, "superseded", f"version {info['version']} was deployed")
            return info

    def _deploy_text(self, text: str, filename: str, python_path: list[str]) -> dict[str, Any]:
        """A canary's promotion: deploy its YAML (its canary ends as promoted, not here)."""
        config = load_pipeline_text(
            text, filename, check_functions=False, base_dir=python_path[0] if python_path else ""
        )
        with self.locks.of(config.name):
            return self.deploys.apply(config, text, filename, python_path)

    def versions(self, name: str) -> builtins.list[dict[str, Any]]:
        """The kept versions of a pipeline, newest first: version, deploy time, file, whether
        it serves now, and which version a rollback restored.

        Raises:
            PipelineNotFoundError: no pipeline of that name is deployed.
        """
        return self.deploys.versions(name)

    def rollback(self, name: str, version: int | None = None) -> dict[str, Any]:
        """End the running canary, if any (nothing else changes); otherwise deploy an earlier
        version's YAML again, as a new version (like ``helm rollback``).

        Args:
            version: the version to restore; None: the one before the serving version.

        Raises:
            PipelineNotFoundError: no such pipeline, or no such kept version.
            DeployError: the deployment failed (the serving version stays).
        """
        if version is None:
            ended = self.canaries.roll_back(name)
            if ended is not None:
                return ended
        rec = self.deploys.kept(name, version)
        return self.deploy(
            rec["yaml"], rec["filename"], rec["python_path"], rollback_of=rec["version"]
        )

    def delete(self, name: str) -> None:
        """Drain the sources, delete the Serve application and forget the pipeline.

        Raises:
            PipelineNotFoundError: no pipeline of that name is deployed.
        """
        self.deploys.delete(name)

    def list(self) -> builtins.list[dict[str, Any]]:
        """Every deployed pipeline: name, version, deploy time, Serve status."""
        return pipeline_list(self._redis)

    def get(self, name: str) -> dict[str, Any]:
        """The stored record of a pipeline (document, YAML, version).

        Raises:
            PipelineNotFoundError: no pipeline of that name is deployed.
        """
        return self.deploys.get(name)

    def status(self, name: str) -> dict[str, Any]:
        """A pipeline's record plus live source counters."""
        return pipeline_status(self._redis, self.get(name), self.scaler.state(name))

    def restore(self) -> builtins.list[str]:
        """Reconcile Ray to the stored state: recreate missing apps and source actors."""
        return self.deploys.restore()

    def ping(self) -> str:
        """Liveness check."""
        return "ok"

    # -- scale to zero (eventbus.serving._scaling) --------------------------------------------
    def wake(self, name: str) -> bool:
        """Run a pipeline scaled to zero again now, and start its idle time afresh (replay and
        redrive call its replicas directly: no lag or sync call wakes it). False: it was not
        at zero.

        Raises:
            PipelineNotFoundError: no pipeline of that name is deployed.
        """
        return self.scaling.wake(PipelineConfig.model_validate(self.get(name)["document"]))

    # -- canary upgrades (eventbus.serving._canaries) -----------------------------------------
    def deploy_canary(
        self,
        text: str,
        filename: str,
        python_path: builtins.list[str],
        *,
        weights: builtins.list[int] | None = None,
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
        return self.canaries.start(
            text,
            filename,
            python_path,
            weights=list(weights or [10, 50, 100]),
            step_s=step_s,
            min_events=min_events,
        )

    def canary_status(self, name: str) -> dict[str, Any] | None:
        """The pipeline's canary (running or how the last one ended), or None."""
        return self.canaries.status(name)

    def promote(self, name: str) -> dict[str, Any]:
        """Deploy the running canary as the serving version now.

        Raises:
            PipelineNotFoundError: no canary of that pipeline is running.
        """
        return self.canaries.promote(name)

    # -- models (eventbus.serving._models) ----------------------------------------------------
    def push_model(self, name: str, blob: bytes, options: dict[str, Any]) -> dict[str, Any]:
        """Add a model version, validate it and swap it in (``ModelControl.push`` options).

        Raises:
            ModelError: the artifact does not load. ModelValidationError: it was rejected.
        """
        self.apps.pace.start()
        return self.models.push(name, blob, **options)

    def list_models(self, name: str | None = None) -> builtins.list[dict[str, Any]]:
        """Every model version: status, traffic share."""
        return self.models.list(name)

    def split_model(self, name: str, version: int | None, weight: float) -> dict[str, Any]:
        """Send ``weight`` of a model's traffic to ``version`` (None: end the split)."""
        self.apps.pace.start()
        return self.models.split(name, version, weight)

    def shadow_model(self, name: str, version: int | None, share: float) -> dict[str, Any]:
        """Mirror ``share`` of a model's rows to ``version`` (None: stop the experiment)."""
        self.apps.pace.start()
        return self.models.shadow(name, version, share)

    def model_history(self, name: str) -> builtins.list[dict[str, Any]]:
        """A model's rollbacks and shadow experiments, newest first."""
        return self.models.history(name)
