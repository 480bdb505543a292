"""The ``model`` step on a multiplexed pool (``model: {pool: NAME, name | select: ...}``).

Per batch: each event's model name (``name``, or its ``select`` CEL expression, which must give
a registry name) and input row; rows grouped by model (and shape) go to the pool's Serve
application as one call per model, all started at once, each with the model as its multiplexed
model id (Serve routes it to a replica already holding that model when one does). An event whose
``select`` fails or gives no model name, whose model is not in the registry, or whose call fails
fails alone (dead-lettered after its retries, with the reason); its batch-mates go on.

The step's stats add the pool's figures as its replicas last reported them: ``pool_loads``,
``pool_evictions``, ``pool_failed_loads`` and ``pool_models`` (models held now), summed over
the pool replicas this step called.
"""

from __future__ import annotations

import re
import time
import zlib
from typing import Any

from eventbus import cel
from eventbus.errors import ConfigError, ModelError
from eventbus.eventing._event import CloudEvent
from eventbus.pipelines._activation import activation_builder, check_identifiers
from eventbus.pipelines._step import StepResult
from eventbus.pipelines.steps._model import _ModelStepBase
from eventbus.pipelines.steps._model_config import ModelStepConfig

__all__ = ["PoolModelStep", "check_select_expression"]

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,47}$")
#: Most distinct models' handles a step keeps (options of one handle per model).
_MAX_HANDLES = 4096


def check_select_expression(source: str) -> cel.Program:
    """Compile a ``select`` expression (over the event, like a filter's).

    Raises:
        cel.CELError: it does not compile or names an unknown variable.
    """
    program = cel.compile(source)
    check_identifiers(program)
    return program


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class PoolModelStep(_ModelStepBase):
    """Runtime of a ``model`` step on a pool (see the module docstring).

    Args:
        step_id: the step id.
        spec: its configuration (``pool`` set).
        remote: must be True: pools run on the platform only.
    """

    kind = "model"

    def __init__(self, step_id: str, spec: ModelStepConfig, *, remote: bool) -> None:
        assert spec.pool is not None
        if not remote:
            msg = (
                f"step {step_id!r}: pool {spec.pool!r} serves models from the registry on the "
                "platform; in process (eventbus test) give the step its own model instead "
                "('name' and 'path', without 'pool')"
            )
            raise ConfigError(msg)
        super().__init__(
            step_id, [], spec.input, spec.output, spec.timeout_s, remote=True, base_dirs=None
        )
        self.spec = spec
        self.pool = spec.pool
        self._select: Any = None
        self._select_build: Any = None
        if spec.select is not None:
            program = check_select_expression(spec.select)
            self._select = program.evaluate
            self._select_build = activation_builder(program.variables)
        self._app: Any = None
        self._handles: dict[str, Any] = {}
        self._replicas: dict[str, dict[str, Any]] = {}

    # -- names --------------------------------------------------------------------------------
    def names(self, events: list[CloudEvent]) -> list[str | None]:
        """Each event's model name, or None with the reason in :attr:`name_errors`."""
        self.name_errors: dict[int, str] = {}
        if self._select is None:
            return [self.spec.name] * len(events)
        out: list[str | None] = []
        for i, e in enumerate(events):
            try:
                value = self._select(self._select_build(e))
            except cel.CELError as exc:
                self.name_errors[i] = (
                    f"select of pool {self.pool!r} failed on event {e.attributes.get('id')!r}: {exc}"
                )
                out.append(None)
                continue
            if not isinstance(value, str):
                self.name_errors[i] = (
                    f"select of pool {self.pool!r} gave {_shown(value)} "
                    f"({'null' if value is None else type(value).__name__}) for "
                    f"event {e.attributes.get('id')!r}, not a model name: make the expression give a string"
                )
                out.append(None)
            elif not _NAME.match(value):
                self.name_errors[i] = (
                    f"select of pool {self.pool!r} gave {_shown(value)} for event "
                    f"{e.attributes.get('id')!r}, not a model name (^[a-z][a-z0-9-]{{0,47}}$)"
                )
                out.append(None)
            else:
                out.append(value)
        return out

    # -- per batch ----------------------------------------------------------------------------
    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        import numpy as np

        results: list[StepResult] = [None] * len(events)
        names = self.names(events)
        groups: dict[tuple[str, tuple[int, ...]], list[tuple[int, Any]]] = {}
        for i, e in enumerate(events):
            name = names[i]
            if name is None:
                results[i] = self._fail(self.name_errors[i], "ModelSelectError")
                continue
            try:
                row = np.asarray(self._input(self._build(e)), dtype=np.float32)
                row = row.reshape(1) if row.ndim == 0 else row
            except (cel.CELError, ValueError, TypeError) as exc:
                results[i] = self._fail(
                    f"input of event {e.attributes.get('id')!r} is not a list of numbers ({type(exc).__name__}: {exc})",
                    "ModelInputError",
                )
                continue
            groups.setdefault((name, row.shape), []).append((i, row))
        if not groups:
            return results
        pending = []
        for (name, _), members in groups.items():
            x = np.stack([r for _, r in members])
            u = np.array(
                [
                    zlib.crc32(
                        f"{events[i].attributes.get('source')}\x00{events[i].attributes.get('id')}".encode()
                    )
                    / 2**32
                    for i, _ in members
                ]
            )
            try:
                pending.append((name, members, self._handle(name).predict.remote((x, u))))
            except Exception as exc:  # noqa: BLE001 - the pool is not there: fail these events
                pending.append((name, members, exc))
        deadline = time.monotonic() + self._timeout_s
        for name, members, call in pending:
            try:
                if isinstance(call, Exception):
                    raise call
                answer = call.result(timeout_s=max(0.1, deadline - time.monotonic()))
                self._note(answer[2])
                if isinstance(answer[0], str) and answer[0] == "error":
                    raise ModelError(answer[1])
                y, versions = answer[0], answer[1]
            except Exception as exc:  # noqa: BLE001 - fail this model's events, not the batch
                reason = (
                    str(exc)
                    if isinstance(exc, ModelError)
                    else f"model {name!r} in pool {self.pool!r}: {type(exc).__name__}: {exc}"
                )
                for i, _ in members:
                    results[i] = self._fail(reason, type(exc).__name__)
                continue
            self.counters["rows"] += len(members)
            self.counters["calls"] += 1
            flat = y.reshape(len(members), -1)
            values = flat[:, 0].tolist() if flat.shape[1] == 1 else y.tolist()
            for k, (i, _) in enumerate(members):
                try:
                    results[i] = self._write(events[i], values[k], int(versions[k]))
                except (cel.CELError, ValueError, TypeError) as exc:
                    results[i] = self._fail(f"writing the output: {exc}", type(exc).__name__)
        return results

    def _handle(self, name: str) -> Any:
        h = self._handles.get(name)
        if h is None:
            if self._app is None:
                from ray import serve

                from eventbus.models._pool import pool_app_name

                try:
                    self._app = serve.get_app_handle(pool_app_name(self.pool))
                except Exception as exc:  # noqa: BLE001 - name the pool and the fix
                    msg = f"model pool {self.pool!r} is not deployed ({exc}); deploy a pipeline declaring it in spec.model_pools"
                    raise ModelError(msg) from None
            if len(self._handles) >= _MAX_HANDLES:
                self._handles.clear()
            h = self._handles[name] = self._app.options(multiplexed_model_id=name)
        return h

    def _note(self, figures: Any) -> None:
        if isinstance(figures, dict) and "replica" in figures:
            if len(self._replicas) >= 256 and str(figures["replica"]) not in self._replicas:
                self._replicas.pop(next(iter(self._replicas)))
            self._replicas[str(figures["replica"])] = figures

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        out["pool"] = self.pool
        for k in ("loads", "evictions", "failed_loads", "held"):
            out[f"pool_{k if k != 'held' else 'models'}"] = sum(
                int(f.get(k, 0)) for f in self._replicas.values()
            )
        return out
