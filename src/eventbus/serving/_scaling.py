"""The controller's scaling reconciler: applies the scale-to-zero watcher's decisions
(``_scale_to_zero``) and wake-up calls to one pipeline at a time, under that pipeline's lock.

A scale-down deletes the pipeline's Serve application and blocks while its replicas drain
and commit; it holds only its own pipeline's lock, so a wake-up of another pipeline (the
watcher's, a gateway's sync call, ``eventbus replay``) runs meanwhile. The watcher applies
each decision on a thread of its own (``ScaleToZero._apply``), so they do.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from eventbus._internal import keys
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._bridge import bridged_groups, broker_holds_joins, open_bridges
from eventbus.serving._locks import PipelineLocks
from eventbus.serving._scale_to_zero import ScaleToZero
from eventbus.serving._serve_apps import ServeApps

__all__ = ["Scaling"]

log = logging.getLogger("eventbus.serving.controller")


class Scaling:
    """Scales ``replicas.min: 0`` pipelines to zero and back, and owns their watcher.

    Args:
        redis: the controller's Redis client (``decode_responses=True``).
        apps: the Serve side (runs and deletes applications).
        locks: the pipelines' locks.
        load: a pipeline's stored record by name (None: not deployed).
        kafka_bootstrap, kafka_client: the stack's Kafka (the watcher reads offsets there).
    """

    def __init__(
        self,
        redis: Any,
        apps: ServeApps,
        locks: PipelineLocks,
        load: Callable[[str], dict[str, Any] | None],
        kafka_bootstrap: str,
        kafka_client: KafkaClientConfig | None,
    ) -> None:
        self._redis = redis
        self.apps = apps
        self.locks = locks
        self._load = load
        self.kafka_bootstrap = kafka_bootstrap
        self.kafka_client = kafka_client
        self._woken_at: dict[str, float] = {}  # pipeline -> when wake() had it running again
        # one watcher for every `replicas.min: 0` pipeline (see _scale_to_zero)
        self.watcher = ScaleToZero(redis, self.scale, kafka_bootstrap, kafka_client)

    def scale(self, name: str, zero: bool, last_event_at: float, woken_by: str = "poll") -> None:
        """Scale a ``min: 0`` pipeline's replicas to zero, or back to its configured count
        (the watcher's decision), and record it in ``keys.SCALED_TO_ZERO`` (a wake-up with who
        saw its events: ``woken_by``). Nothing when it was deleted, redeployed without
        ``min: 0`` or is already there meanwhile."""
        with self.locks.of(name):  # not across its deploy, which runs replicas and clears this
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
            if zero:
                self._down(name, last_event_at)
            else:
                self._up(config, record["python_path"], woken_by)

    def _down(self, name: str, last_event_at: float) -> None:
        # recorded first: a gateway that sees it waits for the wake-up
        state = {"since": time.time(), "last_event_at": last_event_at}
        self._redis.hset(keys.SCALED_TO_ZERO, name, json.dumps(state))
        # The Serve application goes, not just its replicas: Serve's controller spends CPU on
        # every application it holds at every control loop, replicas or none (50 applications
        # at zero: ~5.6% of a core). The pipeline's record stays in Redis; waking runs the
        # application again. Blocking: the replicas' drain and commit end first (a serve.run
        # of an application being deleted never returns: this pipeline's lock is held).
        self.apps.delete(name)
        # when the replicas had drained and the application was gone
        settled = {**state, "settled_at": time.time()}
        self._redis.hset(keys.SCALED_TO_ZERO, name, json.dumps(settled))

    def _up(self, config: PipelineConfig, python_path: list[str], woken_by: str) -> None:
        name = config.name
        # when the wake-up began (a cold start's breakdown reads it)
        raw = self._redis.hget(keys.SCALED_TO_ZERO, name)
        woken = {**(json.loads(raw) if raw else {}), "waking_at": time.time(), "woken_by": woken_by}
        self._redis.hset(keys.SCALED_TO_ZERO, name, json.dumps(woken))
        # no member is live in the pipeline's groups: its first replica's sources may consume
        # by assignment while they join, where the broker holds a first join (Tansu: half the
        # session timeout; Apache Kafka answers at once)
        groups = bridged_groups(config, self.kafka_bootstrap).values()
        if groups and broker_holds_joins(self.kafka_bootstrap, self.kafka_client):
            open_bridges(self._redis, groups)
        self.apps.run(config, python_path)
        self._redis.hdel(keys.SCALED_TO_ZERO, name)

    def wake(self, config: PipelineConfig) -> bool:
        """Run a pipeline scaled to zero again now, and start its idle time afresh. False:
        it was not at zero."""
        name = config.name
        if not self._redis.hexists(keys.SCALED_TO_ZERO, name):
            return False
        self.watcher.track(config)
        self.scale(name, False, time.time(), "call")
        # idle time counts from the replica being up, not from the start of its cold start
        # (a short idle_s could otherwise send it back to zero as the wake returns)
        self._woken_at[name] = time.time()
        self.watcher.track(config)
        return True
