"""The ``filter`` step: keep the events for which a CEL expression, or a CloudEvents
Subscriptions API dialect (``exact``, ``prefix``, ``suffix``, ``all``, ``any``, ``not``,
``cel``), an EventBridge event pattern (``pattern``, see :mod:`._pattern`) or
CloudEvents SQL (``sql``), holds."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, TypeAlias

from pydantic import AfterValidator, BaseModel, Field, model_validator

from eventbus import cel, cesql
from eventbus.eventing._event import CloudEvent
from eventbus.pipelines._activation import activation_builder
from eventbus.pipelines._step import ERRORED, Step, StepContext, StepResult
from eventbus.pipelines.steps._pattern import compile_event_pattern, validate_pattern
from eventbus.pipelines.steps._values import CONFIG, CelSource, compile_cel
from eventbus.registry import steps

__all__ = ["FilterDialect", "FilterStep"]


class FilterDialect(BaseModel):
    """A CloudEvents Subscriptions API filter (Knative triggers): exactly one dialect key.

    ``exact``/``prefix``/``suffix`` map attribute names to strings; ``all``/``any`` hold lists
    of filters; ``not`` one filter; ``cel`` a CEL expression; ``pattern`` an EventBridge
    event pattern.
    """

    model_config = CONFIG
    exact: dict[str, str] | None = Field(
        default=None, description="Every attribute equals the value."
    )
    prefix: dict[str, str] | None = Field(
        default=None, description="Every attribute starts with the value."
    )
    suffix: dict[str, str] | None = Field(
        default=None, description="Every attribute ends with the value."
    )
    all: list[FilterDialect | CelSource] | None = Field(
        default=None, description="Every filter matches."
    )
    any: list[FilterDialect | CelSource] | None = Field(
        default=None, description="At least one filter matches."
    )
    not_: FilterDialect | CelSource | None = Field(
        default=None, alias="not", description="The filter does not match."
    )
    cel: CelSource | None = Field(default=None, description="A CEL boolean expression.")
    pattern: Annotated[dict[str, Any], AfterValidator(validate_pattern)] | None = Field(
        default=None,
        description="An EventBridge event pattern: top-level keys are CloudEvent attributes "
        "(detail-type = type), data (= detail) the payload; values are lists of values or "
        "conditions (prefix, suffix, anything-but, numeric, exists, wildcard, "
        "equals-ignore-case, cidr), objects nest, $or alternates.",
    )
    sql: CelSource | None = Field(
        default=None,
        description="A CloudEvents SQL (CESQL v1) boolean expression over the attributes, "
        "e.g. \"type LIKE 'order.%' AND EXISTS subject\".",
    )

    @model_validator(mode="after")
    def _one_dialect(self) -> FilterDialect:
        keys = [
            k
            for k in ("exact", "prefix", "suffix", "all", "any", "not_", "cel", "pattern", "sql")
            if getattr(self, k) is not None
        ]
        if len(keys) != 1:
            got = ", ".join(k.rstrip("_") for k in keys) or "none"
            msg = f"a filter dialect takes exactly one of exact, prefix, suffix, all, any, not, cel, pattern, sql; got {got}"
            raise ValueError(msg)
        return self


Predicate: TypeAlias = Callable[[CloudEvent], bool]


def _cel_predicate(source: str) -> Predicate:
    program = compile_cel(source)
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
    if spec.pattern is not None:
        return compile_event_pattern(spec.pattern)
    if spec.sql is not None:
        matches = cesql.compile(spec.sql).matches
        return lambda e: matches(e.attributes)
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
    (fail closed, as the CloudEvents Subscriptions API says) and is counted in ``errors``, not
    ``filtered``."""

    kind = "filter"
    pure = True

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
            except (cel.CELError, cesql.CESQLError):
                self.errors += 1
                append(ERRORED)
        return out


def _expressions(raw: Any) -> list[tuple[tuple[int | str, ...], str, bool | str]]:
    out: list[tuple[tuple[int | str, ...], str, bool | str]] = []

    def walk(spec: Any, loc: tuple[int | str, ...]) -> None:
        if isinstance(spec, str):
            out.append((loc, spec, False))
        elif isinstance(spec, dict):
            if isinstance(spec.get("cel"), str):
                out.append(((*loc, "cel"), spec["cel"], False))
            if isinstance(spec.get("sql"), str):
                out.append(((*loc, "sql"), spec["sql"], "sql"))
            for key in ("all", "any"):
                if isinstance(spec.get(key), list):
                    for k, sub in enumerate(spec[key]):
                        walk(sub, (*loc, key, k))
            if "not" in spec:
                walk(spec["not"], (*loc, "not"))

    walk(raw, ())
    return out


def _describe(raw: Any) -> str:
    """The dashboard's short label of a filter: its expression, or its dialect and body."""
    if isinstance(raw, str):
        return raw[:160]
    if not isinstance(raw, dict) or not raw:
        return ""
    key, body = next(iter(raw.items()))
    text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"), default=str)
    return f"{key}: {text}"[:160]


@steps.register(
    "filter",
    config=CelSource | FilterDialect,
    description="Keep events for which this CEL expression (or dialect) is true.",
    pure=True,
    expressions=_expressions,
    describe=_describe,
    example="has(data.amount) && data.amount > 100",
)
def build_filter(step_id: str, config: str | FilterDialect, context: StepContext) -> FilterStep:
    """A filter step."""
    return FilterStep(step_id, config)
