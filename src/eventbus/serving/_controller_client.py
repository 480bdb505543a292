"""The driver-side client: connect to Ray, get (or start) the controller, call it."""

from __future__ import annotations

import builtins  # `EventBusClient.list` shadows `list` in the annotations after it
import logging
import os
import sys
from pathlib import Path
from typing import Any

import ray

from eventbus._internal.ray_head import RAY_ENV
from eventbus.errors import EventBusError
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.serving._controller import CONTROLLER_NAME, NAMESPACE, Controller

__all__ = ["EventBusClient"]


def _unwrapped(ref: Any) -> Any:
    """``ray.get``, raising an EventBus error from the controller (or a model replica behind
    it) as itself: a ``RayTaskError`` prints the remote traceback as its message."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause: BaseException | None = exc
        while isinstance(cause, ray.exceptions.RayTaskError):
            cause = cause.cause
        if isinstance(cause, EventBusError):
            raise cause from None
        raise


class EventBusClient:
    """Deploy, delete, list and inspect pipelines on a Ray cluster.

    Args:
        ray_address: the Ray cluster (``host:port``); None means the Ray this process is
            already connected to (tests call ``ray.init`` themselves).
        kafka_bootstrap: default Kafka bootstrap servers for pipelines.
        redis_url: where the controller keeps its state.
        ray_env: environment for the Ray client (auth token settings of ``eventbus up``).
        kafka_client: the stack's Kafka connection settings (TLS, SASL), handed to the
            controller when this call starts it; None: plaintext.

    Raises:
        StackError: Redis at ``redis_url`` is unreachable or refused the credentials.

    Example:
        >>> client = EventBusClient("127.0.0.1:6379", "127.0.0.1:9092", "redis://127.0.0.1:6380/0")  # doctest: +SKIP
        >>> client.deploy("examples/payments/pipeline.yaml")  # doctest: +SKIP
    """

    def __init__(
        self,
        ray_address: str | None,
        kafka_bootstrap: str,
        redis_url: str,
        *,
        ray_env: dict[str, str] | None = None,
        kafka_client: KafkaClientConfig | None = None,
    ) -> None:
        from eventbus._internal.redis_client import check_redis

        # A refused password fails here, named, and not in a controller restarting forever
        # ("" attaches to a running controller, which has its own URL: nothing to check).
        if redis_url:
            check_redis(redis_url)
        for k, v in RAY_ENV.items():
            os.environ.setdefault(k, v)
        os.environ.update(ray_env or {})
        if not ray.is_initialized():
            ray.init(
                address=ray_address,
                namespace=NAMESPACE,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
        # Any: Controller's methods are not @ray.method, so the handle's typed view (Ray's
        # ActorHandle) has no `.remote` on them; the calls below are checked at runtime by Ray.
        self._controller: Any = (
            ray.remote(Controller)
            .options(
                name=CONTROLLER_NAME,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                max_restarts=-1,
                max_task_retries=-1,
            )
            .remote(
                kafka_bootstrap,
                redis_url,
                kafka_client.model_dump(mode="json", exclude_defaults=True)
                if kafka_client is not None
                else None,
            )
        )

    def deploy(
        self,
        path: str | Path,
        *,
        canary: list[int] | None = None,
        step_s: float = 30.0,
        min_events: int = 20,
    ) -> dict[str, Any]:
        """Validate a pipeline file here (functions included), then deploy it.

        Args:
            canary: canary weights in percent (e.g. ``[10, 50, 100]``): the new steps take a
                growing share of the events and are promoted or rolled back automatically
                (see :mod:`eventbus.serving._canary`). None: deploy at once.
            step_s: seconds per canary step.
            min_events: canary events a step needs before it is judged.

        Raises:
            PipelineConfigError: the file has problems (nothing deployed).
            DeployError: the deployment failed (the previous version keeps serving).
        """
        from eventbus.pipelines._loader import load_pipeline

        p = Path(path).resolve()
        sys.path.insert(0, str(p.parent))
        try:
            config = load_pipeline(p)
        finally:
            sys.path.remove(str(p.parent))
        python_path = [str(p.parent), os.getcwd()]
        self._push_step_models(config, python_path)
        text = p.read_text(encoding="utf-8")
        if canary is not None:
            return ray.get(  # type: ignore[no-any-return]
                self._controller.deploy_canary.remote(
                    text,
                    str(path),
                    python_path,
                    weights=canary,
                    step_s=step_s,
                    min_events=min_events,
                )
            )
        info: dict[str, Any] = ray.get(self._controller.deploy.remote(text, str(path), python_path))
        from eventbus.serving._secret_check import deprecated_spellings

        notices = deprecated_spellings(config)
        if notices:  # old spellings that keep working: the CLI prints each
            info["notices"] = notices
        return info

    def promote(self, name: str) -> dict[str, Any]:
        """Make the running canary of a pipeline its serving version now."""
        return ray.get(self._controller.promote.remote(name))  # type: ignore[no-any-return]

    def canary(self, name: str) -> dict[str, Any] | None:
        """The pipeline's canary: running (weight, step, history) or how the last one ended."""
        return ray.get(self._controller.canary_status.remote(name))  # type: ignore[no-any-return]

    def delete(self, name: str) -> None:
        """Drain and delete a pipeline."""
        ray.get(self._controller.delete.remote(name))

    def list(self) -> list[dict[str, Any]]:
        """The deployed pipelines."""
        return ray.get(self._controller.list.remote())  # type: ignore[no-any-return]

    def status(self, name: str) -> dict[str, Any]:
        """A pipeline's version and live source counters."""
        return ray.get(self._controller.status.remote(name))  # type: ignore[no-any-return]

    def wake(self, name: str) -> bool:
        """Run a pipeline scaled to zero again now (False: it was not at zero)."""
        return bool(ray.get(self._controller.wake.remote(name)))

    def get(self, name: str) -> dict[str, Any]:
        """A pipeline's stored record."""
        return ray.get(self._controller.get.remote(name))  # type: ignore[no-any-return]

    def versions(self, name: str) -> builtins.list[dict[str, Any]]:
        """A pipeline's kept versions, newest first (``serving`` marks the live one)."""
        return ray.get(self._controller.versions.remote(name))  # type: ignore[no-any-return]

    def rollback(self, name: str, version: int | None = None) -> dict[str, Any]:
        """Deploy an earlier version again, as a new version (None: the one before the live one).

        Raises:
            PipelineNotFoundError: no such pipeline or kept version.
            DeployError: the deployment failed (the live version keeps serving).
        """
        return ray.get(self._controller.rollback.remote(name, version))  # type: ignore[no-any-return]

    # -- models -------------------------------------------------------------------------------
    def push_model(
        self,
        name: str,
        path: str | Path,
        *,
        factory: str | None = None,
        samples: str | Path | None = None,
        min_accuracy: float | None = None,
        python_path: builtins.list[str] | None = None,
        serve: bool = True,
    ) -> dict[str, Any]:
        """Push a model version: it is loaded beside the serving one, validated on recent
        requests (and ``samples``, an .npz of labelled ``x``, ``y``, against ``min_accuracy``),
        and swapped in; or rejected, the serving version staying. ``serve=False`` leaves it a
        validated ``candidate`` (for :meth:`shadow_model` or :meth:`split_model`).

        Raises:
            ModelError: the file does not load. ModelValidationError: the version was rejected.
        """
        from eventbus.errors import ModelError
        from eventbus.models._artifact import read_artifact

        blob = read_artifact(path)
        labelled = None
        if samples is not None:
            import numpy as np

            try:
                z = np.load(samples, allow_pickle=False)
                labelled = (z["x"], z["y"])
            except (OSError, KeyError, ValueError) as exc:
                msg = f"labelled samples {str(samples)!r} cannot be read ({exc}); give an .npz with arrays 'x' (rows) and 'y' (labels)"
                raise ModelError(msg) from None
        if min_accuracy is not None and labelled is None:
            msg = "--min-accuracy needs labelled samples to score: add --samples FILE.npz"
            raise ModelError(msg)
        path_dirs = (
            python_path
            if python_path is not None
            else [str(Path(path).resolve().parent), os.getcwd()]
        )
        options = {
            "factory": factory,
            "source": str(path),
            "python_path": path_dirs,
            "labelled": labelled,
            "min_accuracy": min_accuracy,
            "serve": serve,
        }
        return _unwrapped(self._controller.push_model.remote(name, blob, options))  # type: ignore[no-any-return]

    def list_models(self, name: str | None = None) -> builtins.list[dict[str, Any]]:
        """Model versions: status, traffic share, which one serves."""
        return _unwrapped(self._controller.list_models.remote(name))  # type: ignore[no-any-return]

    def split_model(self, name: str, version: int | None, weight: float = 0.0) -> dict[str, Any]:
        """Send ``weight`` of a model's traffic to ``version``; ``None`` ends the split."""
        return _unwrapped(self._controller.split_model.remote(name, version, weight))  # type: ignore[no-any-return]

    def shadow_model(self, name: str, version: int | None, share: float = 0.2) -> dict[str, Any]:
        """Mirror ``share`` of a model's rows to ``version``, compared but never delivered;
        ``None`` stops the experiment (its comparison stays in :meth:`list_models`)."""
        return _unwrapped(self._controller.shadow_model.remote(name, version, share))  # type: ignore[no-any-return]

    def model_history(self, name: str) -> builtins.list[dict[str, Any]]:
        """A model's automatic rollbacks (reason, figures, time) and shadow experiments,
        newest first."""
        return _unwrapped(self._controller.model_history.remote(name))  # type: ignore[no-any-return]

    def _push_step_models(self, config: Any, python_path: builtins.list[str]) -> None:
        """A model step's ``path`` becomes the model's first version when it has none."""
        from eventbus.models._artifact import read_artifact
        from eventbus.pipelines._config import model_refs

        for step in config.spec.steps:
            for ref in model_refs(step):
                if ref.path is None:
                    continue
                blob = read_artifact(ref.path, python_path[:1])
                options = {
                    "factory": ref.factory,
                    "source": ref.path,
                    "python_path": python_path,
                    "only_if_missing": True,
                }
                ray.get(self._controller.push_model.remote(ref.name, blob, options))
