"""The ``model`` and ``ensemble`` steps: each event's input row through a model, the output
written back to the event.

Per batch: the ``input`` CEL expression gives each event's row (a list of numbers, possibly
nested); rows that are not numeric, or whose shape is not the model's, fail their own event;
the others go to the model as one array in one call; each output row is written to the
``output`` path (a number for a single output, else a list), or through the ``output``
mapping's CEL expressions, which see ``output``, ``version`` and the event.

Where the model runs: on a Serve replica of the pipeline (``redis_url`` given) the step calls
the model's own deployment, ``eventbus-model-<name>``, through a ``DeploymentHandle``; in
process (``eventbus test``, ``redis_url=None``) it loads the step's ``path`` artifact itself.
A/B splits go by a hash of each event's ``source`` and ``id``, so a retried event lands on the
same version.
"""

from __future__ import annotations

import zlib
from types import SimpleNamespace
from typing import Any

from eventbus import cel
from eventbus.errors import ModelError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._activation import activation_builder, check_identifiers
from eventbus.pipelines._step import Step, StepContext, StepResult
from eventbus.pipelines.steps._model_backends import LocalModel, RemoteModel, example_config
from eventbus.pipelines.steps._model_config import EnsembleConfig, ModelStepConfig, _ModelRef
from eventbus.pipelines.steps._values import attribute_value as _attribute_value
from eventbus.pipelines.steps._values import json_value as _json_value
from eventbus.pipelines.steps._values import set_path as _set_path
from eventbus.registry import steps

__all__ = [
    "OUTPUT_VARIABLES",
    "SHADOW_FIGURES",
    "EnsembleStep",
    "ModelStep",
    "check_output_expression",
]

#: A shadow experiment's figures a model step reports in its stats (``shadow``).
SHADOW_FIGURES = (
    "version",
    "share",
    "rows",
    "agreement",
    "mad",
    "errors",
    "dropped_rows",
    "live_p99_ms",
    "candidate_p99_ms",
)
#: Variables an ``output`` mapping's expressions see besides the event's.
OUTPUT_VARIABLES = frozenset({"output", "version"})


def check_output_expression(source: str) -> cel.Program:
    """Compile an ``output`` mapping expression (``output`` and ``version`` are variables too).

    Raises:
        cel.CELError: it does not compile or names an unknown variable.
    """
    program = cel.compile(source)
    check_identifiers(SimpleNamespace(variables=program.variables - OUTPUT_VARIABLES))  # type: ignore[arg-type]
    return program


class _ModelStepBase(Step):
    """Input rows, per-event failures and output writing, shared by ``model`` and ``ensemble``."""

    blocking = True

    def __init__(
        self,
        step_id: str,
        refs: list[_ModelRef],
        input_src: str,
        output: Any,
        timeout_s: float,
        *,
        remote: bool,
        base_dirs: list[str] | None,
        redis_url: str | None = None,
    ) -> None:
        super().__init__(step_id)
        program = cel.compile(input_src)
        check_identifiers(program)
        self._input = program.evaluate
        self._build = activation_builder(program.variables)
        self._timeout_s = timeout_s
        self.backends: list[Any] = [
            RemoteModel(r, redis_url) if remote else LocalModel(r, step_id, base_dirs) for r in refs
        ]
        self._path: list[str] | None = None
        self._mapping: list[tuple[list[str], Any]] = []
        if isinstance(output, str):
            self._path = output.split(".")
            used: frozenset[str] = frozenset()
        else:
            self._mapping = [
                (p.split("."), check_output_expression(src)) for p, src in output.items()
            ]
            used = (
                frozenset().union(*(prog.variables for _, prog in self._mapping)) - OUTPUT_VARIABLES
            )
        self._out_build = activation_builder(used) if used else None
        self.counters = {"rows": 0, "calls": 0}

    # -- per batch ----------------------------------------------------------------------------
    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        import numpy as np

        results: list[StepResult] = [None] * len(events)
        rows: list[Any] = []
        idx: list[int] = []
        for i, e in enumerate(events):
            try:
                value = self._input(self._build(e))
                row = np.asarray(value, dtype=np.float32)
                if row.ndim == 0:
                    row = row.reshape(1)
                rows.append(row)
                idx.append(i)
            except (cel.CELError, ValueError, TypeError) as exc:
                results[i] = self._fail(
                    f"input of event {e.attributes.get('id')!r} is not a list of numbers ({type(exc).__name__}: {exc})",
                    "ModelInputError",
                )
        if not rows:
            return results
        expected = self._expected_shape(rows)
        keep = []
        for i, row in zip(idx, rows):
            if row.shape != expected:
                names = ", ".join(repr(b.name) for b in self.backends)
                results[i] = self._fail(
                    f"input of event {events[i].attributes.get('id')!r} has shape {row.shape}; model {names} takes rows of shape "
                    f"{expected}: fix the step's 'input' expression or push a model for that shape",
                    "ModelInputError",
                )
            else:
                keep.append(i)
        if not keep:
            return results
        x = (
            np.stack([rows[idx.index(i)] for i in keep])
            if len(keep) != len(idx)
            else np.stack(rows)
        )
        u = np.array(
            [
                zlib.crc32(
                    f"{events[i].attributes.get('source')}\x00{events[i].attributes.get('id')}".encode()
                )
                / 2**32
                for i in keep
            ]
        )
        try:
            y, versions = self._predict(x, u)
        except Exception as exc:  # noqa: BLE001 - the model failed: fail these events, not the replica
            reason = (
                str(exc)
                if isinstance(exc, ModelError)
                else f"model call failed: {type(exc).__name__}: {exc}"
            )
            for i in keep:
                results[i] = self._fail(reason, type(exc).__name__)
            return results
        self.counters["rows"] += len(keep)
        self.counters["calls"] += 1
        flat = y.reshape(len(keep), -1)
        scalar = flat.shape[1] == 1
        values = flat[:, 0].tolist() if scalar else y.tolist()
        for k, i in enumerate(keep):
            try:
                results[i] = self._write(events[i], values[k], versions[k])
            except (cel.CELError, ValueError, TypeError) as exc:
                results[i] = self._fail(f"writing the output: {exc}", type(exc).__name__)
        return results

    def _expected_shape(self, rows: list[Any]) -> tuple[int, ...]:
        shape = None
        for b in self.backends:
            shape = shape or b.input_shape
        if shape is not None:
            return tuple(shape)
        counts: dict[tuple[int, ...], int] = {}
        for r in rows:
            counts[r.shape] = counts.get(r.shape, 0) + 1
        return max(counts, key=counts.__getitem__)  # unknown: the batch's most common shape

    def _predict(self, x: Any, u: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def _fail(self, message: str, error_type: str) -> Failure:
        self.errors += 1
        return Failure(step=self.id, error_type=error_type, message=message)

    def _write(self, e: CloudEvent, value: Any, version: Any) -> CloudEvent:
        attrs = dict(e.attributes)
        data = e.data
        copied: set[int] = set()
        if self._path is not None:
            targets = [(self._path, value)]
        else:
            act = self._out_build(e) if self._out_build else {}
            act["output"] = value
            act["version"] = version
            targets = [(keys, prog.evaluate(act)) for keys, prog in self._mapping]
        for keys, v in targets:
            if keys[0] == "data":
                data = (
                    _json_value(v)
                    if len(keys) == 1
                    else _set_path(data, keys[1:], _json_value(v), copied, e)
                )
            else:
                attrs[keys[0]] = _attribute_value(keys[0], v)
        if data is not None and "datacontenttype" not in attrs:
            attrs["datacontenttype"] = "application/json"
        return CloudEvent(attrs, data)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        waits = sum(getattr(getattr(b, "waker", None), "waits", 0) for b in self.backends)
        if waits:  # calls that found a model at zero and waited for its wake
            out["zero_waits"] = waits
        return out


class ModelStep(_ModelStepBase):
    """Runtime of a ``model`` step (see the module docstring).

    Args:
        step_id: the step id.
        spec: its configuration.
        remote: call the model's Serve deployment (on a replica) instead of loading it here.
        base_dirs: where a relative ``path`` is read.
    """

    kind = "model"

    def __init__(
        self,
        step_id: str,
        spec: ModelStepConfig,
        *,
        remote: bool,
        base_dirs: list[str] | None = None,
        redis_url: str | None = None,
    ) -> None:
        super().__init__(
            step_id,
            [spec],
            spec.input,
            spec.output,
            spec.timeout_s,
            remote=remote,
            base_dirs=base_dirs,
            redis_url=redis_url,
        )
        self.spec = spec

    def _predict(self, x: Any, u: Any) -> tuple[Any, Any]:
        b = self.backends[0]
        y, versions = b.result(b.call(x, u), self._timeout_s)
        return y, [int(v) for v in versions]

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = super().stats()
        shadow = getattr(self.backends[0], "shadow", None)
        if shadow:  # the model's shadow experiment, as its replicas last told
            out["shadow"] = {
                "model": self.backends[0].name,
                **{k: shadow.get(k) for k in SHADOW_FIGURES},
            }
        return out


class EnsembleStep(_ModelStepBase):
    """Runtime of an ``ensemble`` step: every model on the same rows (concurrently when
    remote), outputs combined by ``combine``; ``version`` is the list of versions."""

    kind = "ensemble"

    def __init__(
        self,
        step_id: str,
        spec: EnsembleConfig,
        *,
        remote: bool,
        base_dirs: list[str] | None = None,
        redis_url: str | None = None,
    ) -> None:
        from eventbus.models._combine import combiner

        self._combine = combiner(spec.combine)  # before loading models: a bad name fails fast
        super().__init__(
            step_id,
            list(spec.models),
            spec.input,
            spec.output,
            spec.timeout_s,
            remote=remote,
            base_dirs=base_dirs,
            redis_url=redis_url,
        )
        self.spec = spec
        self._weights = [m.weight for m in spec.models]

    def _predict(self, x: Any, u: Any) -> tuple[Any, Any]:
        import numpy as np
        import torch

        pending = [b.call(x, u) for b in self.backends]
        answers = [b.result(p, self._timeout_s) for b, p in zip(self.backends, pending)]
        outs = [torch.from_numpy(np.asarray(y)) for y, _ in answers]
        shapes = {tuple(o.shape) for o in outs}
        if len(shapes) != 1:
            names = ", ".join(
                f"{b.name}: {tuple(o.shape[1:])}" for b, o in zip(self.backends, outs)
            )
            msg = f"ensemble models give outputs of different shapes ({names}); combine models whose outputs match"
            raise ModelError(msg)
        y = self._combine(outs, self._weights)
        versions = [[int(a[1][k]) for a in answers] for k in range(len(x))]
        return (y.numpy() if hasattr(y, "numpy") else np.asarray(y)), versions


def _expressions(raw: Any) -> list[tuple[tuple[int | str, ...], str, bool]]:
    out: list[tuple[tuple[int | str, ...], str, bool]] = []
    if not isinstance(raw, dict):
        return out
    if isinstance(raw.get("input"), str) and raw["input"]:
        out.append((("input",), raw["input"], False))
    if isinstance(raw.get("select"), str) and raw["select"]:
        out.append((("select",), raw["select"], False))
    mapping = raw.get("output")  # output mappings also see `output` and `version`
    for path, source in mapping.items() if isinstance(mapping, dict) else ():
        if isinstance(source, str) and source:
            out.append((("output", str(path)), source, True))
    return out


def _where(context: StepContext) -> dict[str, Any]:
    """Where a model step's models run, from its context."""
    remote, base = context.remote, context.base_dirs or None
    return {"remote": remote, "base_dirs": base, "redis_url": context.redis_url}


@steps.register(
    "model",
    config=ModelStepConfig,
    description="Run each event through a model (its own Ray Serve deployment, or a pool's).",
    expressions=_expressions,
    models=lambda config: [config] if config.pool is None else [],
    example=example_config,
    describe=lambda raw: str(raw.get("name") or raw.get("select") or raw.get("model") or ""),
)
def build_model(step_id: str, config: ModelStepConfig, context: StepContext) -> Step:
    """A model step: on a replica it calls the model's Serve deployment (or its pool's), in
    process (``eventbus test``) it loads the step's artifact itself."""
    if config.pool is not None:
        from eventbus.pipelines.steps._model_pool import PoolModelStep

        return PoolModelStep(step_id, config, remote=context.remote)
    return ModelStep(step_id, config, **_where(context))


@steps.register(
    "ensemble",
    config=EnsembleConfig,
    description="Run each event through several models and combine their outputs.",
    expressions=_expressions,
    models=lambda config: list(config.models),
    example=lambda folder: {
        "models": [
            {"name": "example", "path": str(example_config(folder)["path"])},
            {"name": "example-b", "path": str(example_config(folder)["path"])},
        ],
        "combine": "mean",
        "input": "[1.0, 2.0, 3.0]",
        "output": "data.score",
    },
)
def build_ensemble(step_id: str, config: EnsembleConfig, context: StepContext) -> EnsembleStep:
    """An ensemble step (see :func:`build_model`)."""
    return EnsembleStep(step_id, config, **_where(context))
