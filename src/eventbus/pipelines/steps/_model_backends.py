"""Where a ``model`` or ``ensemble`` step's model runs: :class:`LocalModel` loads the step's
``path`` artifact in this process (``eventbus test``), :class:`RemoteModel` calls the model's own
Serve deployment through a handle (on the platform). Both answer ``input_shape``,
``call(x, u)`` (start a prediction) and ``result(pending, timeout_s)``."""

from __future__ import annotations

import time
from typing import Any

from eventbus.errors import ConfigError, ModelError, ModelWakeError
from eventbus.models._zero import Waker
from eventbus.pipelines.steps._model_config import _ModelRef

__all__ = ["LocalModel", "RemoteModel", "example_config"]

#: How often a deployed model's input shape is asked again.
_INFO_EVERY_S = 5.0


class LocalModel:
    """A model loaded in this process from the step's ``path``."""

    def __init__(self, ref: _ModelRef, step_id: str, base_dirs: list[str] | None) -> None:
        from eventbus.models._artifact import load_model, pick_device, read_artifact

        if ref.path is None:
            msg = (
                f"step {step_id!r}: model {ref.name!r} runs in process here (eventbus test) and needs "
                "its artifact: add 'path:' (a TorchScript, torch.export or state_dict file) to the step"
            )
            raise ConfigError(msg)
        self.name = ref.name
        self.model = load_model(
            read_artifact(ref.path, base_dirs),
            factory=ref.factory,
            device=pick_device(),
            what=f"model {ref.name!r} ({ref.path})",
        )

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        return self.model.input_shape

    def call(self, x: Any, u: Any) -> Any:
        import numpy as np
        import torch

        y = self.model(torch.from_numpy(x)).numpy()
        return y, np.zeros(len(x), dtype=np.int64)

    @staticmethod
    def result(pending: Any, timeout_s: float) -> Any:
        return pending


class RemoteModel:
    """The model's own Serve deployment, called through a handle."""

    def __init__(self, ref: _ModelRef, redis_url: str | None = None) -> None:
        self.name = ref.name
        self._handle: Any = None
        #: asks the model back when its application scaled to zero (``serving.idle_s``)
        self.waker: Waker | None = Waker(redis_url, ref.name) if redis_url else None
        self._shape: tuple[int, ...] | None = None
        self._shape_at = 0.0
        self._made_at = time.monotonic()
        #: The model's shadow experiment, as its replica last told (None: none runs).
        self.shadow: dict[str, Any] | None = None

    def _h(self) -> Any:
        if self._handle is None:
            from ray import serve

            from eventbus.models._serve import model_app_name

            try:
                self._handle = serve.get_app_handle(model_app_name(self.name))
            except Exception as exc:  # noqa: BLE001 - name the model and the fix
                msg = f"model {self.name!r} is not deployed ({exc}); deploy a pipeline using it, or push it with `eventbus model push {self.name} PATH`"
                raise ModelError(msg) from None
        return self._handle

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        now = time.monotonic()
        # Unknown in the first minute, the shape is asked again at every batch: a model
        # replica still loading answers None, and a batch read meanwhile must not take its
        # odd rows' shape as the model's for _INFO_EVERY_S (a lone malformed row then reached
        # the model). A model whose artifact never tells its shape is asked every 5 s after.
        fresh = self._shape is None and now - self._made_at < 60.0
        if fresh or now - self._shape_at > _INFO_EVERY_S:
            self._shape_at = now
            info = self._ask(lambda h, t: h.info.remote().result(timeout_s=t), 30.0)
            self._shape = tuple(info["input_shape"]) if info.get("input_shape") else None
            shadow = info.get("shadow")
            self.shadow = dict(shadow) if isinstance(shadow, dict) else None
        return self._shape

    def call(self, x: Any, u: Any) -> Any:
        try:
            return (x, u, self._h().predict.remote((x, u)))
        except Exception as exc:  # noqa: BLE001 - at zero? result() asks it back
            return (x, u, exc)

    def result(self, pending: Any, timeout_s: float) -> Any:
        x, u, response = pending

        def first(h: Any, t: float) -> Any:
            if isinstance(response, Exception):
                raise response
            return response.result(timeout_s=t)

        res = self._ask(
            first, timeout_s, again=lambda h, t: h.predict.remote((x, u)).result(timeout_s=t)
        )
        if isinstance(res[0], str) and res[0] == "error":
            raise ModelError(res[1])
        return res

    def _ask(self, op: Any, timeout_s: float, again: Any = None) -> Any:
        """``op(handle, timeout_s)``; when it fails because the model's application is at zero
        (or going there), ask it back, wait for it within the same deadline and run ``again``
        (default ``op``) once on the new application.

        Raises:
            ModelWakeError: it did not run again in time, or its wake failed (retriable).
        """
        from ray.serve.exceptions import DeploymentUnavailableError

        deadline = time.monotonic() + timeout_s
        try:
            return op(self._h(), timeout_s)
        except ModelWakeError:
            raise
        except Exception as exc:
            if self.waker is None:
                raise
            if not self.waker.at_zero():
                if not isinstance(exc, DeploymentUnavailableError):
                    raise
                # another caller woke it meanwhile: this handle saw the old application go
            else:
                self.waker.wake(deadline)
        self._handle = None  # the application is a new one when it is back
        return (again or op)(self._h(), max(0.1, deadline - time.monotonic()))


def example_config(folder: Any) -> dict[str, Any]:
    """A working config over a small TorchScript model written into ``folder``."""
    from pathlib import Path

    import torch

    path = Path(folder) / "example.pt2"
    if not path.exists():
        torch.manual_seed(0)
        module = torch.nn.Linear(3, 1).eval()
        torch.export.save(torch.export.export(module, (torch.zeros(1, 3),)), str(path))
    return {
        "name": "example",
        "path": str(path),
        "input": "[1.0, 2.0, 3.0]",
        "output": "data.score",
    }
