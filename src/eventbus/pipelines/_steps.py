"""Step templates: ``filter``, ``convert``, ``function``. Batch-first.

A step's ``process(events)`` returns one result per input event, in order: a
:class:`CloudEvent` (one output), ``None`` (dropped), a list of events (zero or more), or a
:class:`Failure`. Expressions are compiled once, when the step is built.
"""

from __future__ import annotations

import base64
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeAlias

from eventbus import cel
from eventbus.eventing._event import CloudEvent, format_time
from eventbus.eventing._outcome import Failure
from eventbus.functions._function import function_spec, resolve_function
from eventbus.pipelines._activation import activation_builder, check_identifiers
from eventbus.pipelines._config import (
    ConvertConfig,
    FilterDialect,
    FunctionStepConfig,
    StepConfig,
)

__all__ = ["ConvertStep", "FilterStep", "FunctionStep", "Step", "StepResult", "build_step"]

StepResult: TypeAlias = "CloudEvent | None | list[CloudEvent] | Failure"


class Step(ABC):
    """A batch-first pipeline step.

    Args:
        step_id: the step's id, carried into failures.
    """

    template: str = ""

    def __init__(self, step_id: str) -> None:
        self.id = step_id
        self.errors = 0  # events this step failed or (filters) could not evaluate

    @abstractmethod
    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        """One result per input event, in order."""

    def _failure(self, exc: BaseException, attempts: int = 1) -> Failure:
        self.errors += 1
        message = getattr(exc, "message", None) or str(exc) or repr(exc)
        return Failure(
            step=self.id, error_type=type(exc).__name__, message=message, attempts=attempts
        )


# -- filter -------------------------------------------------------------------------------

Predicate: TypeAlias = Callable[[CloudEvent], bool]


def _compile_cel(source: str) -> cel.Program:
    program = cel.compile(source)
    check_identifiers(program)
    return program


def _cel_predicate(source: str) -> Predicate:
    program = _compile_cel(source)
    build = activation_builder(program.variables)
    evaluate = program.evaluate

    def pred(e: CloudEvent) -> bool:
        result = evaluate(build(e))
        if result is True:
            return True
        if result is False:
            return False
        msg = f"filter expression {source!r} gave {result!r} ({type(result).__name__}); a filter must give a bool"
        raise cel.CELError(msg)

    return pred


def _dialect_predicate(spec: FilterDialect | str) -> Predicate:
    if isinstance(spec, str):
        return _cel_predicate(spec)
    if spec.cel is not None:
        return _cel_predicate(spec.cel)
    if spec.exact is not None:
        items = tuple(spec.exact.items())
        return lambda e: all(e.attributes.get(k) == v for k, v in items)
    if spec.prefix is not None:
        items = tuple(spec.prefix.items())
        return lambda e: all(
            isinstance(a := e.attributes.get(k), str) and a.startswith(v) for k, v in items
        )
    if spec.suffix is not None:
        items = tuple(spec.suffix.items())
        return lambda e: all(
            isinstance(a := e.attributes.get(k), str) and a.endswith(v) for k, v in items
        )
    if spec.all is not None:
        preds = tuple(_dialect_predicate(s) for s in spec.all)
        return lambda e: all(p(e) for p in preds)
    if spec.any is not None:
        preds = tuple(_dialect_predicate(s) for s in spec.any)
        return lambda e: any(p(e) for p in preds)
    assert spec.not_ is not None
    inner = _dialect_predicate(spec.not_)
    return lambda e: not inner(e)


class FilterStep(Step):
    """Keep the events for which the condition holds; an evaluation error drops the event
    (fail closed, as the CloudEvents Subscriptions API says) and is counted in ``errors``."""

    template = "filter"

    def __init__(self, step_id: str, spec: str | FilterDialect) -> None:
        super().__init__(step_id)
        self._pred = _dialect_predicate(spec)

    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        pred = self._pred
        out: list[StepResult] = []
        append = out.append
        for e in events:
            try:
                append(e if pred(e) else None)
            except cel.CELError:
                self.errors += 1
                append(None)
        return out


# -- convert ------------------------------------------------------------------------------


def _json_value(value: Any) -> Any:
    """CEL values that JSON cannot hold, in their CEL/JSON string forms."""
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


_PLAIN = (str, int, float, bool, type(None))


def _attribute_value(name: str, value: Any) -> Any:
    if isinstance(value, datetime):
        return format_time(value)
    if name in ("id", "source", "type", "subject", "datacontenttype", "dataschema", "time"):
        if not isinstance(value, str) or not value:
            msg = f"attribute {name!r} must be a non-empty string; the expression gave {value!r}"
            raise ValueError(msg)
        return value
    if isinstance(value, bool | int | str) and value != "":
        return value
    msg = f"extension attribute {name!r} must be a string, integer or bool; the expression gave {value!r}"
    raise ValueError(msg)


class ConvertStep(Step):
    """Rewrite each event: ``data:`` replaces data, ``set:`` assigns paths, ``remove:`` drops
    paths. Every expression sees the input event. An evaluation error fails the event."""

    template = "convert"

    def __init__(self, step_id: str, spec: ConvertConfig) -> None:
        super().__init__(step_id)
        self._data = _compile_cel(spec.data) if spec.data is not None else None
        self._sets = [(path.split("."), _compile_cel(src)) for path, src in spec.set.items()]
        self._removes = [path.split(".") for path in spec.remove]
        used: frozenset[str] = frozenset()
        for prog in [*(p for _, p in self._sets), *([self._data] if self._data else [])]:
            used |= prog.variables
        self._build = activation_builder(used)

    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        out: list[StepResult] = []
        for e in events:
            try:
                out.append(self._convert(e))
            except (cel.CELError, ValueError, TypeError) as exc:
                out.append(self._failure(exc))
        return out

    def _convert(self, e: CloudEvent) -> CloudEvent:
        act = self._build(e)
        attrs = dict(e.attributes)
        data = e.data
        if self._data is not None:
            data = self._data.evaluate(act)
            if not isinstance(data, _PLAIN) or isinstance(data, (dict, list)):
                data = _json_value(data)
        copied: set[int] = set()
        for keys, prog in self._sets:
            value = prog.evaluate(act)
            if keys[0] == "data":
                if len(keys) == 1:
                    data = _json_value(value)
                else:
                    data = _set_path(data, keys[1:], _json_value(value), copied, e)
            else:
                attrs[keys[0]] = _attribute_value(keys[0], value)
        for keys in self._removes:
            if keys[0] == "data":
                data = None if len(keys) == 1 else _remove_path(data, keys[1:], copied)
            else:
                attrs.pop(keys[0], None)
        if data is not None and "datacontenttype" not in attrs and not isinstance(data, bytes):
            attrs["datacontenttype"] = "application/json"
        return CloudEvent(attrs, data)


def _set_path(data: Any, keys: list[str], value: Any, copied: set[int], e: CloudEvent) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        msg = f"cannot set data.{'.'.join(keys)}: data is {type(data).__name__}, not an object"
        raise ValueError(msg)
    if id(data) not in copied:
        data = dict(data)
        copied.add(id(data))
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = {}
        elif not isinstance(child, dict):
            msg = f"cannot set data.{'.'.join(keys)}: {key!r} holds {type(child).__name__}, not an object"
            raise ValueError(msg)
        if id(child) not in copied:
            child = dict(child)
            copied.add(id(child))
        node[key] = child
        node = child
    node[keys[-1]] = value
    return data


def _remove_path(data: Any, keys: list[str], copied: set[int]) -> Any:
    if not isinstance(data, dict):
        return data
    if id(data) not in copied:
        data = dict(data)
        copied.add(id(data))
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            return data
        if id(child) not in copied:
            child = dict(child)
            copied.add(id(child))
        node[key] = child
        node = child
    node.pop(keys[-1], None)
    return data


# -- function -----------------------------------------------------------------------------


def function_ref(step: StepConfig) -> str:
    """The ``module:attr`` reference of a function step."""
    fn = step.function
    return fn.ref if isinstance(fn, FunctionStepConfig) else str(fn)


class FunctionStep(Step):
    """Run a user function. A per-event function is called per event; a batch function once
    per batch, and, when the batch call raises, once per event so that only the failing
    events fail."""

    template = "function"

    def __init__(self, step_id: str, ref: str, *, batch: bool | None = None) -> None:
        super().__init__(step_id)
        self.ref = ref
        self._fn = resolve_function(ref)
        spec = function_spec(self._fn)
        self.batch = spec.batch if batch is None else batch

    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        if self.batch and events:
            try:
                results = self._fn(events)
                if not isinstance(results, list) or len(results) != len(events):
                    got = (
                        f"{type(results).__name__} of {len(results)}"
                        if isinstance(results, list)
                        else type(results).__name__
                    )
                    msg = (
                        f"batch function {self.ref!r} returned {got} results for {len(events)} events; "
                        "a batch function returns a list with one result per input event"
                    )
                    raise TypeError(msg)
                return [self._check(r) for r in results]
            except Exception:  # noqa: BLE001 - isolate the failing events below
                pass
        return [self._one(e) for e in events]

    def _one(self, e: CloudEvent) -> StepResult:
        # One try: retries happen at the source (RetryPolicy), off the replica's thread, so a
        # failing event's backoff never holds up its batch-mates.
        try:
            result = self._fn([e])[0] if self.batch else self._fn(e)
            return self._check(result)
        except Exception as exc:  # noqa: BLE001 - user code: fail only this event
            return self._failure(exc)

    def _check(self, result: Any) -> StepResult:
        if result is None or type(result) is CloudEvent:
            return result  # type: ignore[no-any-return]
        if isinstance(result, (list, tuple)) and all(type(r) is CloudEvent for r in result):
            return list(result)
        if isinstance(result, Failure):
            return result
        msg = (
            f"function {self.ref!r} returned {type(result).__name__}; return a CloudEvent, None "
            "(drop the event) or a list of CloudEvents"
        )
        raise TypeError(msg)


# -- building -----------------------------------------------------------------------------


def build_step(
    step: StepConfig,
    *,
    pipeline: str = "",
    redis_url: str | None = None,
    base_dirs: list[str] | None = None,
) -> Step:
    """Build the runtime step for a step config (compiling expressions, importing functions).

    ``pipeline`` and ``redis_url`` locate the state of ``join`` and ``allocate`` steps (None:
    in memory); ``base_dirs`` is where relative data files (an allocate catalogue) are read.
    """
    if step.model is not None or step.ensemble is not None:
        from eventbus.pipelines._model import EnsembleStep, ModelStep

        # On a replica (redis_url given) the step calls the model's own Serve deployment; in
        # process (eventbus test) it loads the step's artifact itself.
        remote = redis_url is not None
        if step.model is not None:
            return ModelStep(step.id, step.model, remote=remote, base_dirs=base_dirs)
        return EnsembleStep(step.id, step.ensemble, remote=remote, base_dirs=base_dirs)  # type: ignore[arg-type]
    if step.allocate is not None:
        from eventbus.pipelines._allocate import AllocateStep

        return AllocateStep(
            step.id, step.allocate, pipeline=pipeline, redis_url=redis_url, base_dirs=base_dirs
        )  # type: ignore[return-value]
    if step.join is not None:
        from eventbus.pipelines._join import JoinStep

        return JoinStep(step.id, step.join, pipeline=pipeline, redis_url=redis_url)  # type: ignore[return-value]
    if step.filter is not None:
        return FilterStep(step.id, step.filter)
    if step.convert is not None:
        return ConvertStep(step.id, step.convert)
    fn = step.function
    batch = fn.batch if isinstance(fn, FunctionStepConfig) else None
    return FunctionStep(step.id, function_ref(step), batch=batch)
