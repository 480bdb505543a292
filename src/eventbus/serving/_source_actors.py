"""The controller's source actors (``serving.source_placement: actor``): one detached
:class:`~eventbus.serving._source_actor.SourceActor` per consumed source, started after the
pipeline's application and drained before it goes."""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from eventbus.errors import DeployError
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._deployment import app_name

__all__ = [
    "NAMESPACE",
    "actor_count",
    "ensure_sources",
    "source_actor_name",
    "start_sources",
    "stop_sources",
]

log = logging.getLogger("eventbus.serving.controller")

#: The Ray namespace of the controller and the source actors.
NAMESPACE = "eventbus"


def source_actor_name(pipeline: str, index: int) -> str:
    """The Ray actor name of a pipeline's source."""
    return f"eventbus-source-{pipeline}-{index}"


def actor_count(config: PipelineConfig) -> int:
    """How many source actors the pipeline runs: one per consumed source with
    ``source_placement: actor``, none when its replicas consume."""
    if config.spec.serving.source_placement != "actor":
        return 0
    return len(config.consumed_sources)


def start_sources(config: PipelineConfig, runtime: dict[str, Any]) -> None:
    """Start the pipeline's source actors and wait until each consumes (none when its
    replicas consume). ``runtime``: ``kafka_bootstrap``, ``redis_url``, ``kafka_client``.

    Raises:
        DeployError: a source did not start within 60 s.
    """
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
            runtime["kafka_bootstrap"],
            runtime["redis_url"],
            runtime["kafka_client"],
        )
        actors.append(actor)
    for i, actor in enumerate(actors):
        if not ray.get(actor.ready.remote(60.0), timeout=90):
            msg = f"source {i} of pipeline {config.name!r} did not start within 60 s"
            raise DeployError(msg)


def ensure_sources(config: PipelineConfig, runtime: dict[str, Any]) -> None:
    """Start the source actors again when one of them is missing (a controller restart)."""
    if config.spec.serving.source_placement != "actor":
        return
    for i in range(len(config.consumed_sources)):
        try:
            ray.get_actor(source_actor_name(config.name, i), namespace=NAMESPACE)
        except ValueError:
            start_sources(config, runtime)
            return


def stop_sources(name: str, count: int) -> None:
    """Drain (deliver and commit what is in flight) and end a pipeline's source actors."""
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


def _wait_gone(actor_name: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(actor_name, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.05)
