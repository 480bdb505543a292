"""Run a pipeline's schedule sources beside its consumers (see ``eventing.sources._schedule``).

With ``source_placement: replica`` every replica runs them (one holds each schedule's lease at
a time); with ``actor``, the source actor that consumes the ingress topic does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing.sources._schedule import ScheduleRunner
from eventbus.eventing.sources._schedule_config import ScheduleSourceConfig
from eventbus.pipelines._config import PipelineConfig

__all__ = ["run_schedules", "schedules_of"]

log = logging.getLogger("eventbus.serving.schedules")


def schedules_of(config: PipelineConfig) -> list[ScheduleSourceConfig]:
    """The pipeline's schedule sources."""
    return [s.options for s in config.spec.sources if s.kind == "schedule"]


async def run_schedules(
    config: PipelineConfig,
    *,
    bootstrap: str,
    redis_url: str | None,
    stop: asyncio.Event,
    kafka_client: KafkaClientConfig | None = None,
    runners: list[ScheduleRunner] | None = None,
) -> None:
    """Run every schedule of ``config`` until ``stop`` is set (returns at once when it has
    none). ``runners``, when given, receives the runners (their counters).

    Raises:
        ValueError: the pipeline has schedules but the runtime has no Redis.
    """
    schedules = schedules_of(config)
    if not schedules:
        return
    if not redis_url:
        msg = f"pipeline {config.name!r} has schedule sources, which keep their state in Redis, but the runtime has no Redis; start EventBus with a Redis URL"
        raise ValueError(msg)
    from eventbus._internal.redis_client import connect_async
    from eventbus.eventing.sinks._kafka import KafkaSink, KafkaSinkConfig
    from eventbus.eventing.sources._http_config import ingress_topic

    redis = connect_async(redis_url)
    sink = KafkaSink(
        KafkaSinkConfig(topic=ingress_topic(config.name)),
        bootstrap_servers=bootstrap,
        client=kafka_client,
    )
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    started = False
    try:
        while not stop.is_set() and not started:  # the broker may still be starting
            try:
                await sink.start()
                started = True
            except Exception as e:  # noqa: BLE001
                log.warning("pipeline %r: schedules wait for the broker: %s", config.name, e)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 2.0)
        made = [
            ScheduleRunner(s, pipeline=config.name, redis=redis, sink=sink, owner=owner)
            for s in schedules
        ]
        if runners is not None:
            runners.extend(made)
        await asyncio.gather(*(r.run(stop) for r in made))
    finally:
        if started:
            await sink.stop()
        await redis.aclose()
