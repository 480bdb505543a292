"""A multiplexed model pool as one Ray Serve application (``eventbus-pool-<name>``).

Each replica holds up to ``max_models_per_replica`` models, loaded from the registry on first
use and evicted least recently used, through Ray Serve's public model multiplexing
(``serve.multiplexed``; callers pick the model with ``handle.options(multiplexed_model_id=...)``
and Serve routes a call to a replica that already holds the model when one does). A call is one
pipeline batch's rows of one model; the answer also carries the replica's load and eviction
counters, which the calling step reports. A held model follows the registry: its serving
version and A/B split are read again at most every second, and a changed revision loads the new
version before it is swapped in (a call in flight finishes on the version it started with).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
import uuid
from typing import Any, cast

from ray import serve
from ray.serve.deployment import Application, Deployment

from eventbus.errors import ModelError
from eventbus.models._artifact import LoadedModel, pick_device
from eventbus.models._forward import Active, forward
from eventbus.models._registry import ModelRegistry
from eventbus.models._serve import load_version

__all__ = ["POOL_APP_PREFIX", "PoolDeployment", "build_pool_app", "pool_app_name"]

log = logging.getLogger("eventbus.models")

POOL_APP_PREFIX = "eventbus-pool-"
#: How often a held model's registry state (serving version, split) is read again.
_FOLLOW_S = 1.0
#: How often a held model's request rows are recorded (for validating its next version).
_RECORD_EVERY_S = 1.0


def pool_app_name(pool: str) -> str:
    """The Serve application of a model pool."""
    return f"{POOL_APP_PREFIX}{pool}"


class _Held:
    """One model held by a pool replica: what serves it now, and the registry revision."""

    def __init__(self, name: str, revision: int, active: Active, on_evict: Any) -> None:
        self.name = name
        self.revision = revision
        self.active = active
        self.checked_at = time.monotonic()
        self.recorded_at = 0.0
        self._on_evict = on_evict
        self._evicted = False

    def __del__(self) -> None:
        # Serve's multiplexer calls __del__ when it evicts the model (LRU); garbage collection
        # may call it again later: count once. A call still running keeps its own reference.
        if not self._evicted:
            self._evicted = True
            self._on_evict(self.name)


class PoolDeployment:
    """A pool replica (see the module docstring).

    Args:
        pool: the pool's name.
        redis_url: the model registry.
        options: :class:`ModelPoolConfig` dumped, ``num_gpus`` resolved.
    """

    def __init__(self, pool: str, redis_url: str, options: dict[str, Any]) -> None:
        import torch

        self.pool = pool
        self._registry = ModelRegistry(redis_url)
        self._device = pick_device()
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        torch.set_num_threads(
            max(1, min(cpus, math.floor(float(options.get("num_cpus") or 0)) or 1))
        )
        self._max_models = int(options.get("max_models_per_replica", 4))
        self._replica = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._loads = 0
        self._evictions = 0
        self._failed_loads = 0
        self._calls = 0
        self._rows = 0

        async def _load_pool_model(model_id: str) -> _Held:
            return await asyncio.to_thread(self._load, model_id)

        self._get = serve.multiplexed(max_num_models_per_replica=self._max_models)(_load_pool_model)

    # -- loading ----------------------------------------------------------------------------
    def _load(self, name: str) -> _Held:
        try:
            revision, active = self._active_of(name, None)
        except Exception:
            with self._lock:
                self._failed_loads += 1
            raise
        with self._lock:
            self._loads += 1
        log.info("pool %r loaded model %r version %s", self.pool, name, active[0])
        return _Held(name, revision, active, self._evicted)

    def _evicted(self, name: str) -> None:
        with self._lock:
            self._evictions += 1
        log.info("pool %r evicted model %r", self.pool, name)

    def _active_of(self, name: str, held: _Held | None) -> tuple[int, Active]:
        """The registry's serving version (and split) of ``name``, loaded (reusing ``held``'s
        models of the same versions)."""
        st = self._registry.state(name)
        if st["serving"] is None:
            if self._registry.exists(name):
                msg = f"model {name!r} has no serving version; push one with `eventbus model push {name} PATH`"
            else:
                msg = f"no model named {name!r} in the registry; push it with `eventbus model push {name} PATH` or fix the step's 'select'"
            raise ModelError(msg)
        have: dict[int, LoadedModel] = {}
        if held is not None:
            a = held.active
            have[a[0]] = a[1]
            if a[2] is not None and a[3] is not None:
                have[a[2]] = a[3]
        split = st["split"]
        wanted = [st["serving"]] + ([split["version"]] if split else [])
        for v in wanted:
            if v not in have:
                have[v] = load_version(self._registry, name, v, self._device)
        b = split["version"] if split else None
        active: Active = (
            st["serving"],
            have[st["serving"]],
            b,
            have[b] if b is not None else None,
            float(split["weight"]) if split else 0.0,
        )
        return int(st["revision"]), active

    def _follow(self, held: _Held) -> None:
        """Swap in the registry's current versions when its revision moved."""
        held.checked_at = time.monotonic()
        if self._registry.state(held.name)["revision"] == held.revision:
            return
        held.revision, held.active = self._active_of(held.name, held)

    # -- serving ----------------------------------------------------------------------------
    async def predict(self, call: tuple[Any, Any]) -> Any:
        """Rows of one model (the request's multiplexed model id): ``(x, u)`` as for a model
        application. Answers ``(outputs, versions, figures)`` or ``("error", message,
        figures)``; ``figures`` are this replica's counters (:meth:`figures`)."""
        name = serve.get_multiplexed_model_id()
        try:
            held = await self._get(name)
            if time.monotonic() - held.checked_at >= _FOLLOW_S:
                await asyncio.to_thread(self._follow, held)
            x = call[0]
            want = held.active[1].input_shape
            if want is not None and tuple(x.shape[1:]) != tuple(want):
                msg = (
                    f"input rows have shape {tuple(x.shape[1:])}; model {name!r} takes rows of "
                    f"shape {tuple(want)}: fix the step's 'input' expression or push a model for that shape"
                )
                raise ModelError(msg)
            out, rows = await asyncio.to_thread(self._run, held, call)
        except ModelError as exc:
            return ("error", str(exc), self.figures())
        except Exception as exc:  # noqa: BLE001 - the caller's events fail with the reason
            return (
                "error",
                f"model {name!r} in pool {self.pool!r}: {type(exc).__name__}: {exc}",
                self.figures(),
            )
        with self._lock:
            self._calls += 1
            self._rows += rows
        answer = out[0]  # (outputs, versions) or ("error", message)
        return (answer[0], answer[1], self.figures())

    def _run(self, held: _Held, call: tuple[Any, Any]) -> tuple[list[Any], int]:
        out, rows, last = forward(held.name, held.active, [call])
        now = time.monotonic()
        if last is not None and now - held.recorded_at >= _RECORD_EVERY_S:
            held.recorded_at = now  # recent rows validate the model's next version
            try:
                self._registry.record_inputs(held.name, last.numpy())
            except Exception:
                log.warning("recording recent inputs of model %r failed", held.name, exc_info=True)
        return out, rows

    def figures(self) -> dict[str, Any]:
        """This replica's counters: ``replica`` (an id), ``loads``, ``evictions``,
        ``failed_loads``, ``held`` (models loaded now), ``calls``, ``rows``."""
        with self._lock:
            return {
                "replica": self._replica,
                "loads": self._loads,
                "evictions": self._evictions,
                "failed_loads": self._failed_loads,
                "held": self._loads - self._evictions,
                "calls": self._calls,
                "rows": self._rows,
            }

    def info(self) -> dict[str, Any]:
        """The pool's name, limit, device and this replica's counters."""
        return {
            "pool": self.pool,
            "max_models_per_replica": self._max_models,
            "device": self._device,
            "pid": os.getpid(),
            **self.figures(),
        }


def build_pool_app(pool: str, redis_url: str, options: dict[str, Any]) -> Application:
    """The Serve application of a pool (``options`` as :class:`ModelPoolConfig` dumps it,
    ``num_gpus`` resolved)."""
    actor: dict[str, Any] = {"num_cpus": float(options.get("num_cpus") or 0)}
    if options.get("num_gpus"):
        actor["num_gpus"] = float(options["num_gpus"])
    deployment = cast(Deployment, serve.deployment(PoolDeployment)).options(
        name="pool",
        num_replicas=int(options.get("replicas", 1)),
        ray_actor_options=actor,
        max_ongoing_requests=64,
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
        health_check_period_s=2,
        graceful_shutdown_timeout_s=10,
    )
    return deployment.bind(pool, redis_url, options)
