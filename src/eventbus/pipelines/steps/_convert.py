"""The ``convert`` step: rewrite events with CEL (``set`` paths, ``remove`` paths, or a new
``data``) or with one JSONata expression producing the new event (``jsonata``, as Knative's
EventTransform). Every expression sees the event as it came into the step."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, StringConstraints, model_validator

from eventbus import cel, jsonata
from eventbus.eventing._event import CloudEvent
from eventbus.pipelines._activation import activation_builder
from eventbus.pipelines._step import Step, StepContext, StepResult
from eventbus.pipelines.steps._convert_jsonata import jsonata_converter
from eventbus.pipelines.steps._values import (
    CONFIG,
    CelSource,
    attribute_value,
    compile_cel,
    json_value,
    remove_path,
    set_path,
)
from eventbus.registry import steps

__all__ = ["ConvertConfig", "ConvertStep"]

#: A path a convert step writes: an attribute name, or ``data`` / ``data.a.b``.
TargetPath = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]+(\.[A-Za-z_][A-Za-z0-9_-]*)*$")]


class ConvertConfig(BaseModel):
    """Rewrite events: set paths from CEL expressions, remove paths, or replace ``data``.

    Every expression sees the event as it was before this step (simultaneous assignment).
    """

    model_config = CONFIG
    set: dict[TargetPath, CelSource] = Field(
        default_factory=dict,
        description="Target path -> CEL expression. Paths: an attribute ('type', 'subject', an "
        "extension) or 'data.a.b'.",
    )
    remove: list[TargetPath] = Field(default_factory=list, description="Paths to remove.")
    data: CelSource | None = Field(
        default=None, description="One CEL expression producing the new data."
    )
    jsonata: CelSource | None = Field(
        default=None,
        description="One JSONata expression over the event (its attributes and 'data') producing "
        "the new event as an object: attributes beside 'data', as Knative's EventTransform "
        '(e.g. {"specversion": "1.0", "id": id, "source": source, "type": "t", "data": data}).',
    )

    @model_validator(mode="after")
    def _something(self) -> ConvertConfig:
        if self.jsonata is not None:
            if self.set or self.remove or self.data is not None:
                msg = "convert 'jsonata' produces the whole event; drop 'set', 'remove' and 'data'"
                raise ValueError(msg)
            return self
        if not self.set and not self.remove and self.data is None:
            msg = "convert does nothing; give 'set', 'remove', 'data' or 'jsonata'"
            raise ValueError(msg)
        for path in [*self.set, *self.remove]:
            if path in ("specversion", "id", "source", "type") and path in self.remove:
                msg = f"convert cannot remove the required attribute {path!r}"
                raise ValueError(msg)
            if path == "specversion":
                msg = "convert cannot change 'specversion'; EventBus emits CloudEvents 1.0"
                raise ValueError(msg)
        if self.data is not None and any(p == "data" or p.startswith("data.") for p in self.set):
            msg = "convert has both 'data' and 'set' paths under data; use one of them"
            raise ValueError(msg)
        return self


_PLAIN = (str, int, float, bool, type(None))
#: Classes whose values JSON holds as they are (json_value returns them unchanged).
_SCALARS = frozenset(_PLAIN)


class ConvertStep(Step):
    """Rewrite each event: ``data:`` replaces data, ``set:`` assigns paths, ``remove:`` drops
    paths. Every expression sees the input event. An evaluation error fails the event."""

    kind = "convert"
    pure = True

    def __init__(self, step_id: str, spec: ConvertConfig) -> None:
        super().__init__(step_id)
        self._jsonata = jsonata_converter(spec.jsonata) if spec.jsonata is not None else None
        self._data = compile_cel(spec.data) if spec.data is not None else None
        self._sets = [(path.split("."), compile_cel(src)) for path, src in spec.set.items()]
        # Per set, resolved once: (attribute name or None for data, the data path under
        # ``data`` (empty: data itself), the compiled expression's evaluate).
        self._plan = [
            (None if keys[0] == "data" else keys[0], keys[1:], prog.evaluate)
            for keys, prog in self._sets
        ]
        self._removes = [path.split(".") for path in spec.remove]
        used: frozenset[str] = frozenset()
        for prog in [*(p for _, p in self._sets), *([self._data] if self._data else [])]:
            used |= prog.variables
        self._build = activation_builder(used)

    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        out: list[StepResult] = []
        if self._jsonata is not None:
            convert = self._jsonata
            for e in events:
                try:
                    out.append(convert(e))
                except (jsonata.JSONataError, ValueError, TypeError) as exc:
                    out.append(self._failure(exc))
            return out
        for e in events:
            try:
                out.append(self._convert(e))
            except (cel.CELError, ValueError, TypeError) as exc:
                out.append(self._failure(exc))
        return out

    def _convert(self, e: CloudEvent) -> CloudEvent:
        act = self._build(e)
        attrs = e.attributes.copy()
        data = e.data
        if self._data is not None:
            data = self._data.evaluate(act)
            if not isinstance(data, _PLAIN) or isinstance(data, (dict, list)):
                data = json_value(data)
        copied: set[int] = set()
        # Per event and set: scalars (the usual values) skip the conversions, which change
        # only datetimes, durations, bytes and containers; non-empty strings are valid for
        # every attribute (attribute_value checks the rest).
        for name, path, evaluate in self._plan:
            value = evaluate(act)
            if name is None:
                if value.__class__ not in _SCALARS:
                    value = json_value(value)
                if not path:
                    data = value
                elif len(path) == 1 and data.__class__ is dict:  # data.x: one copy of data
                    if id(data) not in copied:
                        data = data.copy()
                        copied.add(id(data))
                    data[path[0]] = value
                else:
                    data = set_path(data, path, value, copied, e)
            elif value.__class__ is str and value:
                attrs[name] = value
            else:
                attrs[name] = attribute_value(name, value)
        for keys in self._removes:
            if keys[0] == "data":
                data = None if len(keys) == 1 else remove_path(data, keys[1:], copied)
            else:
                attrs.pop(keys[0], None)
        if data is not None and "datacontenttype" not in attrs and not isinstance(data, bytes):
            attrs["datacontenttype"] = "application/json"
        return CloudEvent(attrs, data)


def _expressions(raw: Any) -> list[tuple[tuple[int | str, ...], str, bool | str]]:
    """Each expression's location, source and kind (False: CEL, "jsonata": JSONata)."""
    out: list[tuple[tuple[int | str, ...], str, bool | str]] = []
    if isinstance(raw, dict):
        if isinstance(raw.get("data"), str):
            out.append((("data",), raw["data"], False))
        if isinstance(raw.get("jsonata"), str):
            out.append((("jsonata",), raw["jsonata"], "jsonata"))
        if isinstance(raw.get("set"), dict):
            for path, src in raw["set"].items():
                if isinstance(src, str) and src:
                    out.append((("set", str(path)), src, False))
    return out


def _describe(raw: Any) -> str:
    """The dashboard's short label of a convert: its JSONata expression, else its keys."""
    if not isinstance(raw, dict):
        return ""
    if isinstance(raw.get("jsonata"), str):
        return f"jsonata: {' '.join(raw['jsonata'].split())}"[:160]
    return ", ".join(sorted(raw))


@steps.register(
    "convert",
    config=ConvertConfig,
    description="Rewrite events.",
    pure=True,
    expressions=_expressions,
    describe=_describe,
    example={"set": {"data.seen": "true", "type": "'converted'"}},
)
def build_convert(step_id: str, config: ConvertConfig, context: StepContext) -> ConvertStep:
    """A convert step."""
    return ConvertStep(step_id, config)
