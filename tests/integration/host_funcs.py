"""A user function whose module loads where a pipeline is deployed from but not in a Ray
worker: the shared-host test's member that cannot start on its host."""

from __future__ import annotations

import ray

import eventbus
from eventbus import CloudEvent

if ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
    msg = "host_funcs refuses to load in a Ray worker (the test's member that cannot start)"
    raise RuntimeError(msg)


@eventbus.function(batch=True)
def same(events: list[CloudEvent]) -> list[CloudEvent]:
    return events
