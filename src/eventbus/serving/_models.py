"""The controller's side of models: push versions, deploy each model's Serve application when
a pipeline that uses it is deployed, delete it when the last such pipeline goes.

A push stores the artifact as a candidate; when the model's application runs, one of its
replicas loads it beside the serving version, validates it and swaps it in (the others follow
the registry); when none runs, the controller validates it here the same way. A version that
fails is marked ``rejected`` and the serving one stays.
"""

from __future__ import annotations

import builtins  # `ModelControl.list` shadows `list` in the annotations after it
import logging
import sys
from typing import Any

from eventbus.errors import DeployError, ModelError
from eventbus.models._registry import ModelRegistry
from eventbus.pipelines._config import PipelineConfig, model_refs
from eventbus.pipelines.steps._model_config import ModelServingConfig
from eventbus.serving._locks import SERVE_RUN

__all__ = ["ModelControl"]

log = logging.getLogger("eventbus.serving.models")


def _pools_of(config: PipelineConfig) -> dict[str, Any]:
    """The pools the pipeline's steps call, with their settings."""
    used = {getattr(s.options, "pool", None) for s in config.spec.steps}
    return {n: p for n, p in config.spec.model_pools.items() if n in used}


def _models_of(config: PipelineConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for step in config.spec.steps:
        for ref in model_refs(step):
            if ref.name not in out or ref.serving is not None:
                out[ref.name] = ref
    return out


class ModelControl:
    """Model operations of the controller (it owns one).

    Args:
        redis_url: the registry's Redis.
    """

    def __init__(self, redis_url: str) -> None:
        from eventbus._internal.redis_client import connect
        from eventbus.serving._model_zero import ModelZero

        self.redis_url = redis_url
        self.registry = ModelRegistry(redis_url)
        #: scales the applications of models with ``idle_s`` to zero and back (started by
        #: the controller)
        self.zero = ModelZero(connect(redis_url, decode_responses=True), self._run_app, _delete_app)

    # -- versions ---------------------------------------------------------------------------
    def push(
        self,
        name: str,
        blob: bytes,
        *,
        factory: str | None = None,
        source: str = "",
        python_path: list[str] | None = None,
        labelled: tuple[Any, Any] | None = None,
        min_accuracy: float | None = None,
        only_if_missing: bool = False,
        serve: bool = True,
    ) -> dict[str, Any]:
        """Add a version; validate and swap it in (see the module docstring); with
        ``serve=False`` it is validated and left a ``candidate`` (for a shadow or a split).

        Returns:
            ``{"name", "version", "serving", "status", "pushed": bool}``.

        Raises:
            ModelError: the artifact does not load (nothing is stored).
            ModelValidationError: it was stored, validated and rejected; the old one serves.
        """
        from eventbus.models._artifact import load_model
        from eventbus.models._serve import validate_version

        if (
            only_if_missing
            and self.registry.exists(name)
            and self.registry.state(name)["serving"] is not None
        ):
            st = self.registry.state(name)
            return {
                "name": name,
                "version": st["serving"],
                "serving": st["serving"],
                "status": "serving",
                "pushed": False,
            }
        for p in reversed(python_path or []):
            if p not in sys.path:
                sys.path.insert(0, p)
        loaded = load_model(
            blob, factory=factory, what=f"model {name!r} artifact {source or ''}".strip()
        )
        version = self.registry.add_version(
            name,
            blob,
            format=loaded.format,
            factory=factory,
            source=source,
            input_shape=loaded.input_shape,
            python_path=python_path,
        )
        if labelled is not None:
            self.registry.set_labelled(name, labelled[0], labelled[1], min_accuracy)
        handle = self._handle(name) if serve else None
        if handle is not None:
            handle.update.remote(version).result(timeout_s=300)
        else:
            validate_version(self.registry, name, version)
            if serve or self.registry.state(name)["serving"] is None:
                self.registry.set_serving(name, version)
        st = self.registry.state(name)
        return {
            "name": name,
            "version": version,
            "serving": st["serving"],
            "status": "serving" if st["serving"] == version else "candidate",
            "pushed": True,
        }

    def list(self, name: str | None = None) -> builtins.list[dict[str, Any]]:
        """Models (or one model's versions): versions, which one serves, the split, the shadow
        experiment's comparison (``shadow``: figures, with ``active`` and ``share``)."""
        names = [name] if name else self.registry.names()
        rows = []
        for n in names:
            if not self.registry.exists(n):
                self.registry.record(n, 0)  # raises the "no model named" error
            st = self.registry.state(n)
            scale: dict[str, Any] | None = None  # on the serving version's row
            for rec in self.registry.versions(n):
                share = 0.0
                if rec["version"] == st["serving"]:
                    share = 1.0 - (st["split"]["weight"] if st["split"] else 0.0)
                elif st["split"] and st["split"]["version"] == rec["version"]:
                    share = st["split"]["weight"]
                shadow = self.registry.comparison(n, rec["version"])
                if shadow is not None:
                    shadow["active"] = bool(
                        st["shadow"] and st["shadow"]["version"] == rec["version"]
                    )
                fields = ("version", "format", "status", "error", "pushed_at", "size", "source")
                if rec["version"] == st["serving"] and scale is None:
                    scale = self.zero.state(n)
                rows.append(
                    {
                        "name": n,
                        **{k: rec.get(k) for k in fields},
                        "traffic": share,
                        "shadow": shadow,
                        "scale": scale if rec["version"] == st["serving"] else None,
                    }
                )
        return rows

    def shadow(self, name: str, version: int | None, share: float) -> dict[str, Any]:
        """Mirror ``share`` of the model's rows to ``version`` (None stops the experiment).
        When the model's application runs, one of its replicas follows the setting before
        this returns (the candidate loaded, mirroring: calls answered after it are mirrored;
        other replicas follow at their next look, within a second): ``mirroring`` says
        whether that replica mirrors to ``version`` now (None: no replica was asked).

        Raises:
            ModelError: unknown model or version, a rejected or the serving version, a share
                outside (0, 1].
        """
        if not self.registry.exists(name):
            self.registry.record(name, 0)
        out = {**self.registry.set_shadow(name, version, share), **self.registry.state(name)}
        return {**out, "mirroring": _follow_shadow(self._handle(name), name, version)}

    def history(self, name: str) -> builtins.list[dict[str, Any]]:
        """The model's rollbacks and shadow experiments, newest first."""
        if not self.registry.exists(name):
            self.registry.record(name, 0)
        return self.registry.history(name)

    def split(self, name: str, version: int | None, weight: float) -> dict[str, Any]:
        """Send ``weight`` of the model's traffic to ``version`` (None ends the split)."""
        if not self.registry.exists(name):
            self.registry.record(name, 0)
        if version is not None and version == self.registry.state(name)["serving"]:
            msg = (
                f"version {version} of model {name!r} already serves; split towards another version"
            )
            raise ModelError(msg)
        self.registry.set_split(name, version, weight)
        return self.registry.state(name)

    # -- applications -----------------------------------------------------------------------
    def ensure_apps(self, config: PipelineConfig, *, running: set[str]) -> builtins.list[str]:
        """Deploy (or update) the Serve application of every model the pipeline uses.

        Raises:
            DeployError: a model has no serving version.
        """
        from ray import serve

        from eventbus.models._serve import build_model_app, model_app_name

        started = []
        for name, ref in _models_of(config).items():
            st = self.registry.state(name) if self.registry.exists(name) else None
            if st is None or st["serving"] is None:
                known = ", ".join(self.registry.names()) or "none"
                msg = (
                    f"pipeline {config.name!r} uses model {name!r}, which has no serving version in the registry "
                    f"(models: {known}); push one with `eventbus model push {name} PATH`, or give the step 'path:'"
                )
                raise DeployError(msg)
            stored = self.registry.options(name)
            options = (
                (ref.serving or ModelServingConfig()).model_dump()
                if ref.serving is not None or not stored
                else dict(stored)
            )
            if options.get("num_gpus") is None:
                options["num_gpus"] = 1 if _cluster_has_gpu() else 0
            with self.zero.lock(name):
                if options == stored and (
                    model_app_name(name) in running or self.zero.state(name)["at_zero"]
                ):
                    # running, or at zero with the same settings: it stays there (its
                    # next call wakes it)
                    self.zero.track(name, options.get("idle_s"), fresh=False)
                    continue
                with SERVE_RUN:  # serve.run is not thread-safe (_locks)
                    serve.run(
                        build_model_app(name, self.redis_url, options),
                        name=model_app_name(name),
                        route_prefix=None,
                    )
                self.registry.set_options(name, options)
                self.zero.track(name, options.get("idle_s"))
                self.zero.ran(name)  # no longer at zero
            started.append(name)
        started += self._ensure_pools(config, running)
        return started

    def _ensure_pools(self, config: PipelineConfig, running: set[str]) -> builtins.list[str]:
        """Deploy (or update) the pools the pipeline calls; its pool steps' static model
        names must be in the registry."""
        from ray import serve

        from eventbus.models._pool import build_pool_app, pool_app_name

        for step in config.spec.steps:
            name = getattr(step.options, "name", None)
            if getattr(step.options, "pool", None) is None or name is None:
                continue
            if self.registry.state(name)["serving"] is None:
                msg = (
                    f"pipeline {config.name!r} step {step.id!r} calls model {name!r} on pool "
                    f"{step.options.pool!r}, which has no serving version in the registry; push "
                    f"one with `eventbus model push {name} PATH`"
                )
                raise DeployError(msg)
        started = []
        for pool, settings in _pools_of(config).items():
            options = settings.model_dump()
            if options.get("num_gpus") is None:
                options["num_gpus"] = 1 if _cluster_has_gpu() else 0
            if pool_app_name(pool) in running and self.registry.pool_options(pool) == options:
                continue
            with SERVE_RUN:  # serve.run is not thread-safe (_locks)
                serve.run(
                    build_pool_app(pool, self.redis_url, options),
                    name=pool_app_name(pool),
                    route_prefix=None,
                )
            self.registry.set_pool_options(pool, options)
            started.append(f"pool:{pool}")
        return started

    def release(self, pipeline: str, documents: builtins.list[dict[str, Any]]) -> None:
        """Delete the applications of models no remaining pipeline (``documents``) uses."""
        from ray import serve

        from eventbus.models._pool import pool_app_name
        from eventbus.models._serve import model_app_name

        gone = PipelineConfig.model_validate(
            next(d for d in documents if d["metadata"]["name"] == pipeline)
        )
        others = [
            PipelineConfig.model_validate(doc)
            for doc in documents
            if doc["metadata"]["name"] != pipeline
        ]
        for kind, used_by, app_name in (
            ("model", _models_of, model_app_name),
            ("model pool", _pools_of, pool_app_name),
        ):
            still = {name for config in others for name in used_by(config)}
            for name in set(used_by(gone)) - still:
                try:
                    serve.delete(app_name(name))
                except Exception:
                    log.exception("deleting the Serve application of %s %r failed", kind, name)
                if kind == "model":
                    self.zero.forget(name)

    def _run_app(self, name: str) -> None:
        """Run a model's application with its stored options (a wake from zero)."""
        from ray import serve

        from eventbus.models._serve import build_model_app, model_app_name

        with SERVE_RUN:  # serve.run is not thread-safe (_locks)
            serve.run(
                build_model_app(name, self.redis_url, self.registry.options(name)),
                name=model_app_name(name),
                route_prefix=None,
            )

    @staticmethod
    def _handle(name: str) -> Any:
        from ray import serve

        from eventbus.models._serve import model_app_name

        try:
            if model_app_name(name) not in serve.status().applications:
                return None
            return serve.get_app_handle(model_app_name(name))
        except Exception:  # noqa: BLE001 - Serve not started: no application
            return None


def _delete_app(name: str) -> None:
    """Delete a model's application (a scale to zero; blocking while its replicas drain)."""
    from ray import serve

    from eventbus.models._serve import model_app_name

    serve.delete(model_app_name(name))


def _cluster_has_gpu() -> bool:
    import ray

    try:
        return float(ray.cluster_resources().get("GPU", 0)) > 0  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001
        return False


def _follow_shadow(handle: Any, name: str, version: int | None) -> bool | None:
    """Have one replica of the model's application follow the shadow setting now: whether it
    mirrors to ``version`` (None: no application runs, or it did not answer; the setting holds
    and the replicas follow it at their next look)."""
    if handle is None:
        return None
    try:
        info = handle.follow.remote().result(timeout_s=120)
    except Exception as exc:  # noqa: BLE001 - the setting holds; replicas poll it
        log.warning("model %r: a replica did not follow the shadow setting: %s", name, exc)
        return None
    running = info.get("shadow") or {}
    return version is not None and running.get("version") == version
