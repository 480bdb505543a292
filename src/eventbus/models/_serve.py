"""A model as its own Ray Serve application (``eventbus-model-<name>``), shared by every
pipeline that uses it.

Each replica loads the serving version from the registry (and the A/B version when traffic is
split) onto the GPU when it has one, else the CPU with torch's threads pinned to the replica's
CPUs. Calls are merged by ``@serve.batch`` across pipelines and callers: every call is a batch
of rows, the merged rows run as one forward pass. A new version is loaded beside the old one,
validated, and swapped in by replacing one reference: a call in flight finishes on the version
it started with, so no request is dropped. Other replicas follow the registry's ``revision``
(polled every 0.25 s) and swap the same way.

Live experiments (:mod:`eventbus.models._live`): a shadow version set in the registry is loaded
too and a share of the rows is mirrored to it off the live path, its comparison flushed to the
registry every second; each version's passes are counted and a version that took a split or
all traffic is rolled back in the registry when it regresses (the ``rollback`` settings).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
import threading
import time
from typing import Any, cast

from ray import serve
from ray.serve.deployment import Application, Deployment

from eventbus.errors import ModelError, ModelValidationError
from eventbus.models._artifact import LoadedModel, load_model, pick_device
from eventbus.models._forward import Active, forward
from eventbus.models._judge import RollbackPolicy
from eventbus.models._live import LiveGuard, ShadowMirror
from eventbus.models._registry import ModelRegistry
from eventbus.models._validate import validate_candidate

__all__ = [
    "MODEL_APP_PREFIX",
    "ModelDeployment",
    "build_model_app",
    "load_version",
    "model_app_name",
    "validate_version",
]

log = logging.getLogger("eventbus.models")

MODEL_APP_PREFIX = "eventbus-model-"
_POLL_S = 0.25
_RECORD_EVERY_S = 1.0


def model_app_name(name: str) -> str:
    """The Serve application of a model."""
    return f"{MODEL_APP_PREFIX}{name}"


def load_version(registry: ModelRegistry, name: str, version: int, device: str) -> LoadedModel:
    rec = registry.record(name, version)
    for p in reversed(rec.get("python_path") or []):
        if p not in sys.path:
            sys.path.insert(0, p)
    return load_model(
        registry.blob(name, version),
        factory=rec.get("factory"),
        device=device,
        what=f"model {name!r} version {version}",
    )


def validate_version(
    registry: ModelRegistry,
    name: str,
    version: int,
    *,
    device: str = "cpu",
    serving: LoadedModel | None = None,
) -> LoadedModel:
    """Load ``version`` beside the serving one and validate it on the recorded recent requests
    and the labelled samples; mark it rejected and raise when it fails.

    Raises:
        ModelValidationError: it does not load, or fails validation (it is marked ``rejected``).
    """
    import torch

    try:
        candidate = load_version(registry, name, version, device)
    except ModelError as exc:
        registry.mark(name, version, "rejected", str(exc))
        raise ModelValidationError(name, version, str(exc)) from None
    st = registry.state(name)
    if serving is None and st["serving"] is not None and st["serving"] != version:
        try:
            serving = load_version(registry, name, st["serving"], device)
        except ModelError:
            serving = None
    shape = candidate.input_shape or (serving.input_shape if serving else None)
    recent = registry.recent_inputs(name, shape)
    lab = registry.labelled(name)
    report = validate_candidate(
        candidate,
        torch.from_numpy(recent).float() if recent is not None else None,
        serving=serving,
        labelled=(torch.from_numpy(lab[0]).float(), torch.from_numpy(lab[1])) if lab else None,
        min_accuracy=lab[2] if lab else None,
    )
    if not report.ok:
        registry.mark(name, version, "rejected", report.reason)
        raise ModelValidationError(name, version, report.reason)
    return candidate


class ModelDeployment:
    """A replica serving one model (see the module docstring).

    Args:
        name: the model's registry name.
        redis_url: the registry.
        options: ``max_batch_size``, ``batch_wait_ms``, ``num_cpus`` (see ModelServingConfig).
    """

    def __init__(self, name: str, redis_url: str, options: dict[str, Any]) -> None:
        import torch

        self.name = name
        self._registry = ModelRegistry(redis_url)
        self._device = pick_device()
        cpus = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
        self._threads = max(1, min(cpus, math.floor(float(options.get("num_cpus") or 0)) or 1))
        torch.set_num_threads(self._threads)
        self._models: dict[int, LoadedModel] = {}
        self._active: Active | None = None
        self._revision = -1
        self._calls = 0
        self._rows = 0
        self._last_record = 0.0
        self._called_at = float("-inf")
        self._update_lock = threading.Lock()
        self._guard = LiveGuard(
            name, self._registry, RollbackPolicy.from_options(options.get("rollback"))
        )
        self._mirror: ShadowMirror | None = None
        self._flushed_at = 0.0
        self._shadow_figures: dict[str, Any] | None = None
        self._sync()
        if self._active is None:
            msg = f"model {name!r} has no serving version; push one with `eventbus model push {name} PATH`"
            raise ModelError(msg)
        self.predict.set_max_batch_size(int(options.get("max_batch_size", 16)))
        self.predict.set_batch_wait_timeout_s(float(options.get("batch_wait_ms", 1.0)) / 1000)
        self._stop: threading.Event = threading.Event()
        self._watcher = threading.Thread(
            target=self._watch, name=f"eventbus-model-{name}-watch", daemon=True
        )
        self._watcher.start()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    # -- serving ----------------------------------------------------------------------------
    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.001)
    async def predict(self, calls: list[tuple[Any, Any]]) -> list[Any]:
        """Rows of several calls in one forward pass. Each call is ``(x, u)``: rows (numpy,
        first dimension the rows) and each row's draw in [0, 1) for the A/B split (or None).
        Each answer is ``(outputs, versions)`` or ``("error", message)``."""
        return await asyncio.to_thread(self._infer, calls)

    def _infer(self, calls: list[tuple[Any, Any]]) -> list[Any]:
        active = self._active
        assert active is not None
        mirror = self._mirror
        out, rows, last = forward(
            self.name,
            active,
            calls,
            observe=self._guard.observe,
            mirror=mirror.offer if mirror is not None else None,
        )
        self._rows += rows
        now = time.monotonic()
        if last is not None and now - self._last_record >= _RECORD_EVERY_S:
            self._last_record = now
            try:
                self._registry.record_inputs(self.name, last.numpy())
            except Exception:
                log.warning("recording recent inputs of model %r failed", self.name, exc_info=True)
        self._calls += len(calls)
        if now - self._called_at >= _RECORD_EVERY_S:  # the idle time of scale to zero
            self._called_at = now
            try:
                self._registry.called(self.name)
            except Exception:
                log.warning("recording the last call of model %r failed", self.name, exc_info=True)
        return out

    # -- updates ----------------------------------------------------------------------------
    def update(self, version: int) -> dict[str, Any]:
        """Load ``version`` beside the serving one, validate it, and swap it in.

        Raises:
            ModelValidationError: it failed; it is marked rejected and the old one keeps serving.
        """
        with self._update_lock:
            active = self._active
            candidate = validate_version(
                self._registry,
                self.name,
                version,
                device=self._device,
                serving=active[1] if active else None,
            )
            self._models[version] = candidate
            self._registry.set_serving(self.name, version)
            self._sync()
            return self.info()

    def follow(self) -> dict[str, Any]:
        """Follow the registry now, not at the next poll (the controller calls it after a
        shadow setting changed, so the command returns once this replica mirrors); returns
        :meth:`info`."""
        with self._update_lock:
            self._sync()
        return self.info()

    def _sync(self) -> None:
        """Follow the registry: load what serves now (and the split's version), then swap."""
        st = self._registry.state(self.name)
        if st["revision"] == self._revision or st["serving"] is None:
            return
        wanted = [st["serving"]] + ([st["split"]["version"]] if st["split"] else [])
        for v in wanted:
            if v not in self._models:
                self._models[v] = load_version(self._registry, self.name, v, self._device)
        split = st["split"]
        b = split["version"] if split else None
        before = (self._active[0], self._active[2]) if self._active else (None, None)
        self._follow_shadow(st["shadow"], wanted)
        self._guard.moved(before, (st["serving"], b))
        self._active = (
            st["serving"],
            self._models[st["serving"]],
            b,
            self._models[b] if b is not None else None,
            float(split["weight"]) if split else 0.0,
        )
        self._revision = st["revision"]
        for v in list(self._models):
            if v not in wanted:
                del self._models[v]

    def _follow_shadow(self, shadow: dict[str, Any] | None, wanted: list[int]) -> None:
        """Start, change or stop the shadow mirror as the registry says (the candidate stays
        loaded: ``wanted`` gets its version)."""
        mirror = self._mirror
        same = (
            shadow is not None
            and mirror is not None
            and mirror.version == int(shadow["version"])
            and mirror.share == float(shadow["share"])
            and mirror.started_at == _started_at(shadow)
        )
        if same:
            wanted.append(int(shadow["version"]))  # type: ignore[index]
            return
        if mirror is not None:
            self._mirror = None
            mirror.stop()
            self._flush(mirror)
        if shadow is None:
            return
        v = int(shadow["version"])
        try:
            if v not in self._models:
                self._models[v] = load_version(self._registry, self.name, v, self._device)
        except ModelError:
            log.warning("model %r: shadow version %s does not load", self.name, v, exc_info=True)
            return
        wanted.append(v)
        self._mirror = ShadowMirror(
            self.name, v, self._models[v], float(shadow["share"]), started_at=_started_at(shadow)
        )

    def _flush(self, mirror: ShadowMirror) -> None:
        try:
            mirror.flush(self._registry)
        except Exception:
            log.warning(
                "model %r: recording the shadow comparison failed", self.name, exc_info=True
            )

    def _watch(self) -> None:
        while not self._stop.wait(_POLL_S):
            try:
                with self._update_lock:
                    self._sync()
                    active = self._active
                    if active is not None and self._guard.look(active[0], active[2]):
                        self._sync()
                mirror = self._mirror
                now = time.monotonic()
                if mirror is not None and now - self._flushed_at >= _RECORD_EVERY_S:
                    self._flushed_at = now
                    self._flush(mirror)
                    self._shadow_figures = self._registry.comparison(self.name, mirror.version)
            except Exception:
                log.warning("model %r: following the registry failed", self.name, exc_info=True)

    def info(self) -> dict[str, Any]:
        """What this replica serves: version, split, device, torch threads, counters."""
        active = self._active
        return {
            "name": self.name,
            "serving": active[0] if active else None,
            "split": {"version": active[2], "weight": active[4]}
            if active and active[2] is not None
            else None,
            "input_shape": list(active[1].input_shape)
            if active and active[1].input_shape
            else None,
            "device": self._device,
            "threads": self._threads,
            "calls": self._calls,
            "rows": self._rows,
            "shadow": {
                **(self._shadow_figures or {}),
                "version": self._mirror.version,
                "share": self._mirror.share,
                "started_at": self._mirror.started_at,
            }
            if self._mirror is not None
            else None,
            "rollbacks": self._guard.rollbacks,
            "pid": os.getpid(),
        }


def _started_at(shadow: dict[str, Any]) -> float | None:
    """The start of a shadow setting's experiment (None when unreadable)."""
    try:
        return float(shadow["started_at"])
    except (KeyError, TypeError, ValueError):
        return None


def build_model_app(name: str, redis_url: str, options: dict[str, Any]) -> Application:
    """The Serve application of a model (``options`` as :class:`ModelServingConfig` dumps it,
    ``num_gpus`` resolved)."""
    actor: dict[str, Any] = {"num_cpus": float(options.get("num_cpus") or 0)}
    if options.get("num_gpus"):
        actor["num_gpus"] = float(options["num_gpus"])
    # `serve.deployment(cls)` returns a Deployment; ray annotates only the decorator form.
    deployment = cast(Deployment, serve.deployment(ModelDeployment)).options(
        name="model",
        num_replicas=int(options.get("replicas", 1)),
        ray_actor_options=actor,
        max_ongoing_requests=max(64, 4 * int(options.get("max_batch_size", 16))),
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
        health_check_period_s=2,
        graceful_shutdown_timeout_s=10,
    )
    return deployment.bind(name, redis_url, options)
