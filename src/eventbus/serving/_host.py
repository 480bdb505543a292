"""Shared hosts: many pipelines in the replica process(es) of one Serve application.

A pipeline with ``serving.host: H`` does not get a Serve application of its own: it runs in
the replicas of ``eventbus-host-H`` with every other pipeline naming ``H``. Each member keeps
everything a pipeline has in a replica of its own (a :class:`PipelineDeployment`: its runner,
its consumer group's sources, its figures), so status, dashboard and metrics see it as its
own pipeline; what members share is the process: an idle pipeline costs no Ray actor, no
Serve application and no Serve health checks of its own (Flink task managers host many jobs'
tasks, a Faust worker many agents, the same way).

The membership is the host deployment's ``user_config`` (``{"members": {name: {"document",
"python_path", "stamp"}}}``) and is kept in Redis (``keys.HOSTS``, see ``_host_control``).
Serve calls :meth:`HostDeployment.reconfigure` on the running replicas when it changes, and
on a (re)started replica before its first call: a member whose stamp changed is drained,
committed and started again; the others are not touched.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from ray import serve
from ray.serve.deployment import Application

from eventbus._internal.gc import tune_gc
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.serving._ray_adapter import fixed_version

__all__ = [
    "HOST_APP_PREFIX",
    "HostDeployment",
    "MemberHandle",
    "build_host_app",
    "host_app_name",
    "pipeline_handle",
    "serving_app",
]

log = logging.getLogger("eventbus.serving.host")

HOST_APP_PREFIX = "eventbus-host-"
#: The host deployment's fixed version: a new membership is a lightweight update of the
#: running replicas (Serve calls ``reconfigure``), never a restart of the process.
_HOST_VERSION = "eventbus-host-1"


def host_app_name(host: str) -> str:
    """The Serve application name of a shared host."""
    return f"{HOST_APP_PREFIX}{host}"


def serving_app(document: dict[str, Any]) -> str:
    """The Serve application that runs a pipeline: its own, or its host's."""
    from eventbus.serving._deployment import app_name

    host = document["spec"].get("serving", {}).get("host")
    return host_app_name(host) if host else app_name(document["metadata"]["name"])


class HostDeployment:
    """A Serve replica running the pipelines of one shared host, each as it would run alone.

    Args:
        host: the host's name.
        runtime: what every member's :class:`PipelineDeployment` gets (Kafka, Redis).
    """

    def __init__(self, host: str, runtime: dict[str, Any]) -> None:
        tune_gc()
        self._host = host
        self._runtime = runtime
        self._specs: dict[str, dict[str, Any]] = {}  # name -> {"document", "python_path", "stamp"}
        self._members: dict[str, Any] = {}  # name -> PipelineDeployment
        self._errors: dict[str, str] = {}  # name -> why it does not run
        self._lock = threading.Lock()
        self._restarting: set[str] = set()  # members a health check is restarting

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve's hook for a new ``user_config``: start, restart and stop members to match.

        Off the replica's loop: a leaving member drains and commits its in-flight batches.
        """
        await asyncio.to_thread(self._apply, dict(config.get("members") or {}))

    def _apply(self, wanted: dict[str, dict[str, Any]]) -> None:
        with self._lock:
            for name in list(self._specs):
                spec = wanted.get(name)
                if spec is None or spec["stamp"] != self._specs[name]["stamp"]:
                    self._stop(name)
            for name, spec in sorted(wanted.items()):
                if name not in self._specs:
                    self._start(name, spec)

    def _start(self, name: str, spec: dict[str, Any]) -> None:
        from eventbus.serving._deployment import PipelineDeployment

        self._specs[name] = spec
        try:
            self._members[name] = PipelineDeployment(
                spec["document"], spec["python_path"], self._runtime
            )
            self._errors.pop(name, None)
            log.info("host %r: pipeline %r started", self._host, name)
        except Exception as exc:  # that member's failure, not the host's
            log.exception("host %r: pipeline %r did not start", self._host, name)
            self._errors[name] = f"{type(exc).__name__}: {exc}"

    def _stop(self, name: str) -> None:
        self._specs.pop(name, None)
        self._errors.pop(name, None)
        member = self._members.pop(name, None)
        if member is not None:
            member.close()  # drain + commit, as a replica of its own does on shutdown
            log.info("host %r: pipeline %r stopped", self._host, name)

    def __del__(self) -> None:
        # Serve calls this on graceful shutdown: every member drains and commits.
        for name in list(getattr(self, "_members", {})):
            self._stop(name)

    def check_health(self) -> None:
        """Serve's health check: every member's sources are checked; a member whose sources
        died is restarted alone, off the replica's loop (the others keep running), so no
        member's fault takes the host down. A member that cannot start is reported by
        :meth:`members`."""
        if not self._lock.acquire(blocking=False):
            return  # members are starting or stopping (off the loop): look next time
        try:
            for name, member in list(self._members.items()):
                try:
                    member.check_health()
                except Exception as exc:  # noqa: BLE001 - restart that member only
                    if name in self._restarting:
                        continue
                    self._restarting.add(name)
                    log.warning(
                        "host %r: pipeline %r unhealthy (%s); restarting it", self._host, name, exc
                    )
                    spec = self._specs[name]
                    threading.Thread(
                        target=self._restart, args=(name, spec), name="eventbus-host-restart"
                    ).start()
        finally:
            self._lock.release()

    def _restart(self, name: str, spec: dict[str, Any]) -> None:
        with self._lock:
            self._restarting.discard(name)
            if self._specs.get(name) is spec:  # not changed or gone meanwhile
                self._stop(name)
                self._start(name, spec)

    def _member(self, pipeline: str) -> Any:
        member = self._members.get(pipeline)
        if member is None:
            why = self._errors.get(pipeline, "it is not a member of this host")
            msg = f"pipeline {pipeline!r} does not run on host {self._host!r}: {why}"
            raise LookupError(msg)
        return member

    async def process_member(self, pipeline: str, events: list[CloudEvent]) -> list[Outcome]:
        """Run one member's steps over a batch (sync calls, replay, redrive)."""
        outcomes: list[Outcome] = await self._member(pipeline).process(events)
        return outcomes

    def members(self) -> dict[str, dict[str, Any]]:
        """Each member: its stamp, and the error that keeps it from running (or None)."""
        return {
            name: {"stamp": spec["stamp"], "error": self._errors.get(name)}
            for name, spec in self._specs.items()
        }

    def stats(self) -> dict[str, Any]:
        """The process id and each running member's own ``stats()``."""
        return {
            "pid": os.getpid(),
            "members": {name: m.stats() for name, m in self._members.items()},
            "errors": dict(self._errors),
        }


def build_host_app(
    host: str, members: dict[str, dict[str, Any]], runtime: dict[str, Any]
) -> Application:
    """The Serve application of a shared host: as many replicas as its largest member asks.

    Only the ``user_config`` (the members) and the replica count change between two
    memberships, so Serve reconfigures the running replicas instead of replacing them.
    """
    from eventbus.pipelines._config import PipelineConfig

    configs = [PipelineConfig.model_validate(m["document"]) for m in members.values()]
    replicas = max(c.spec.serving.replica_bounds.max for c in configs)
    in_flight = sum(
        c.spec.serving.batch.max_in_flight * 2 * max(1, len(c.consumed_sources)) for c in configs
    )
    make: Any = serve.deployment
    deployment = fixed_version(
        make(HostDeployment, name="host"),
        _HOST_VERSION,  # the same on every deploy: a membership change keeps replicas up
        num_replicas=replicas,
        ray_actor_options={"num_cpus": 0.0},
        max_ongoing_requests=max(8, in_flight),
        user_config={"members": members},
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
        health_check_period_s=2,
        graceful_shutdown_timeout_s=30,
        graceful_shutdown_wait_loop_s=0.2,
    )
    app: Application = deployment.bind(host, runtime)
    return app


def pipeline_handle(pipeline: str, host: str | None) -> Any:
    """A ``DeploymentHandle``-like handle whose ``process.remote(events)`` runs a pipeline's
    steps, on its own application or on its host's."""
    from eventbus.serving._deployment import app_name

    if host is None:
        return serve.get_app_handle(app_name(pipeline))
    return MemberHandle(serve.get_app_handle(host_app_name(host)), pipeline)


class MemberHandle:
    """A host member's calls through its host's ``DeploymentHandle``, spelt as a pipeline's
    own (``handle.process.remote(events)``), for the gateway's sync calls, replay, redrive."""

    def __init__(self, handle: Any, pipeline: str) -> None:
        self._handle = handle
        self._pipeline = pipeline

    def options(self, **kwargs: Any) -> MemberHandle:
        """The host handle's ``options`` (e.g. :func:`~eventbus.serving._ray_adapter.by_value`'s)."""
        return MemberHandle(self._handle.options(**kwargs), self._pipeline)

    @property
    def process(self) -> _Bound:
        """``process.remote(events)``: the member's ``process``."""
        return _Bound(self._handle.process_member, self._pipeline)


class _Bound:
    def __init__(self, method: Any, pipeline: str) -> None:
        self._method = method
        self._pipeline = pipeline

    def remote(self, *args: Any) -> Any:
        return self._method.remote(self._pipeline, *args)
