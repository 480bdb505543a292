"""The Serve side of a pipeline for the controller's reconcilers: run its application (or its
membership of a shared host), delete it, and keep Serve's control loop at its idle pace while
no application runs.

The reconcilers call these under the pipeline's lock (``_locks``); what pipelines share here
has its own: Serve's pace (:class:`ServePace`) and each host's membership (``Hosts``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._deployment import app_name, build_app
from eventbus.serving._host_control import Hosts
from eventbus.serving._locks import SERVE_RUN

__all__ = ["ServeApps", "ServePace", "deployment_failure", "root_cause"]

log = logging.getLogger("eventbus.serving.controller")


class ServePace:
    """Serve, started once, and its control loop's pace (``_ray_adapter.set_serve_pace``): the usual pace
    while something runs or is about to, idle only once the last application is gone and no
    run is under way (a scale-down of one pipeline settling while another wakes leaves the
    pace alone)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = False
        self._idle: bool | None = None  # Serve's loop at its idle pace (None: unknown)
        self._runs = 0  # runs under way (``running()``)

    def start(self) -> None:
        """Start Serve if it is not, at its usual pace (something is about to run on it)."""
        with self._lock:
            self._start()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Around a ``serve.run``: Serve started at its usual pace, and no :meth:`settle`
        idles it until the run is over."""
        with self._lock:
            self._runs += 1
            try:
                self._start()
            except BaseException:
                self._runs -= 1
                raise
        try:
            yield
        finally:
            with self._lock:
                self._runs -= 1

    def settle(self) -> None:
        """An application went: Serve idles when none is left and no run is under way."""
        with self._lock:
            if not self._runs:
                self._set(idle=True)

    def _start(self) -> None:
        if not self.started:
            from ray import serve

            serve.start(
                proxy_location="Disabled",
                logging_config={"log_level": "WARNING", "enable_access_log": False},
            )
            self.started = True
        self._set(idle=False)

    def _set(self, *, idle: bool) -> None:
        if idle == self._idle:
            return
        try:
            if idle:
                from ray import serve

                if serve.status().applications:
                    return
            from eventbus.serving._ray_adapter import set_serve_pace

            answer = set_serve_pace(idle)
            self._idle = idle if answer != "unsupported" else None
        except Exception as e:  # noqa: BLE001 - only Serve's pace: it keeps its own
            log.warning("setting Serve's control loop pace failed (%s)", e)
            self._idle = None


class ServeApps:
    """Runs and deletes pipelines' Serve applications.

    Args:
        redis: the controller's Redis client (hosts keep their membership there).
        kafka_bootstrap, kafka_client, redis_url: what replicas and source actors get
            (``kafka_client``: the stack's :class:`KafkaClientConfig` as a dict, or None).
    """

    def __init__(
        self, redis: Any, kafka_bootstrap: str, kafka_client: dict[str, Any] | None, redis_url: str
    ) -> None:
        self.kafka_bootstrap = kafka_bootstrap
        self.kafka_client = kafka_client
        self.redis_url = redis_url
        self.pace = ServePace()
        # pipelines sharing a host's replicas (serving.host; see _host)
        self.hosts = Hosts(redis, self.runtime(run_sources=True))

    def runtime(self, *, run_sources: bool) -> dict[str, Any]:
        """What a pipeline's replicas (and source actors) get: Kafka and Redis settings."""
        return {
            "run_sources": run_sources,
            "kafka_bootstrap": self.kafka_bootstrap,
            "kafka_client": self.kafka_client,
            "redis_url": self.redis_url,
        }

    def running(self) -> set[str]:
        """The names of the applications Serve holds (Serve started first)."""
        from ray import serve

        self.pace.start()
        return set(serve.status().applications)

    def run(self, config: PipelineConfig, python_path: list[str]) -> None:
        """Run (or update) the pipeline's application, or its member on its shared host
        (its own application, if it had one, goes: it moved onto the host).

        Raises:
            RuntimeError: the application did not start (the failed deployment's message).
            DeployError: it did not start on its host.
        """
        from ray import serve

        with self.pace.running():
            if config.spec.serving.host is not None:  # on its shared host, not its own app
                self.hosts.join(config, python_path)
                if app_name(config.name) in serve.status().applications:
                    self.delete(config.name, own_only=True)  # it moved onto the host
                return
            self.hosts.leave(config.name)  # it moved off a shared host
            runtime = self.runtime(run_sources=config.spec.serving.source_placement == "replica")
            try:
                with SERVE_RUN:  # serve.run is not thread-safe (_locks)
                    serve.run(
                        build_app(config, python_path, runtime),
                        name=app_name(config.name),
                        route_prefix=None,
                    )
            except RuntimeError as e:  # Serve's message names the deployment, not why
                raise RuntimeError(deployment_failure(app_name(config.name)) or str(e)) from e

    def delete(self, name: str, *, own_only: bool = False) -> None:
        """Delete the pipeline's application, or take it off its shared host (the other
        members untouched; the host's application goes with its last member). Blocking:
        the replicas drain and commit first. ``own_only``: its own application only."""
        from ray import serve

        if not own_only and self.hosts.leave(name):
            self.pace.settle()  # the host's last member: its application went too
            return
        try:
            serve.delete(app_name(name))
        except Exception:
            log.exception("deleting the Serve application of %r failed", name)
        self.pace.settle()


def deployment_failure(app: str) -> str | None:
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


def root_cause(exc: BaseException) -> str:
    """The last line of an error's text (Serve wraps a replica constructor's failure in a
    long traceback), or its type's name."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__
