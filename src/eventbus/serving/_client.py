"""The driver-side client: connect to Ray, get (or start) the controller, call it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import ray

from eventbus.serving._controller import CONTROLLER_NAME, NAMESPACE, Controller
from eventbus._internal.stack import RAY_ENV

__all__ = ["EventBusClient"]


class EventBusClient:
    """Deploy, delete, list and inspect pipelines on a Ray cluster.

    Args:
        ray_address: the Ray cluster (``host:port``); None means the Ray this process is
            already connected to (tests call ``ray.init`` themselves).
        kafka_bootstrap: default Kafka bootstrap servers for pipelines.
        redis_url: where the controller keeps its state.
        ray_env: environment for the Ray client (auth token settings of ``eventbus up``).

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
    ) -> None:
        for k, v in RAY_ENV.items():
            os.environ.setdefault(k, v)
        os.environ.update(ray_env or {})
        if not ray.is_initialized():
            ray.init(address=ray_address, namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
        self._controller = (
            ray.remote(Controller)
            .options(  # type: ignore[attr-defined]
                name=CONTROLLER_NAME,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                max_restarts=-1,
                max_task_retries=-1,
            )
            .remote(kafka_bootstrap, redis_url)
        )

    def deploy(self, path: str | Path) -> dict[str, Any]:
        """Validate a pipeline file here (functions included), then deploy it.

        Raises:
            PipelineConfigError: the file has problems (nothing deployed).
            DeployError: the deployment failed (the previous version keeps serving).
        """
        from eventbus.pipelines._loader import load_pipeline

        p = Path(path).resolve()
        sys.path.insert(0, str(p.parent))
        try:
            load_pipeline(p)
        finally:
            sys.path.remove(str(p.parent))
        python_path = [str(p.parent), os.getcwd()]
        return ray.get(self._controller.deploy.remote(p.read_text(encoding="utf-8"), str(path), python_path))  # type: ignore[no-any-return]

    def delete(self, name: str) -> None:
        """Drain and delete a pipeline."""
        ray.get(self._controller.delete.remote(name))

    def list(self) -> list[dict[str, Any]]:
        """The deployed pipelines."""
        return ray.get(self._controller.list.remote())  # type: ignore[no-any-return]

    def status(self, name: str) -> dict[str, Any]:
        """A pipeline's version and live source counters."""
        return ray.get(self._controller.status.remote(name))  # type: ignore[no-any-return]

    def get(self, name: str) -> dict[str, Any]:
        """A pipeline's stored record."""
        return ray.get(self._controller.get.remote(name))  # type: ignore[no-any-return]
