"""Routing in pipeline YAML: named ``sinks:`` and the ``routes:`` that send events to them.

```yaml
spec:
  sinks:
    hook: {http: {url: "https://hooks.example.com/orders", reply: true}}
    enriched: {kafka: {topic: orders-enriched}}
    audit: {kafka: {topic: audit, bootstrap_servers: "audit-kafka:9092"}}
    next: {pipeline: billing}
  routes:
    - when: "type == 'order.created'"
      sinks: [hook, enriched]        # hook's replies go on to enriched
      ordered: true
    - when: "data.amount > 1000"
      sinks: [audit, next]
    - when: {sql: "source LIKE 'https://partner.%'"}   # CloudEvents SQL instead of CEL
      sinks: [audit]
    - default: true                  # events no ``when`` route matched
      sinks: [audit]
```

Every route whose ``when`` holds gets the event (fan-out); the default route gets the events
no other route took. Each (event, sink) pair is delivered, retried and deduplicated on its own.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

__all__ = [
    "MISSING_SINK",
    "RouteConfig",
    "SinkName",
    "SqlCondition",
    "loop_problems",
    "route_problems",
]

_MODEL = ConfigDict(extra="forbid", frozen=True)

MISSING_SINK = "required field is missing (or give sinks with routes)"

#: A named sink: as a step id (no dots: names join ``pipeline.sink`` in figures and logs).
SinkName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$", max_length=64)]


class SqlCondition(BaseModel):
    """A route condition in CloudEvents SQL (CESQL v1) instead of CEL."""

    model_config = _MODEL
    sql: Annotated[str, StringConstraints(min_length=1, max_length=10_000)] = Field(
        description="A CloudEvents SQL boolean expression over the event's attributes, "
        "e.g. \"type LIKE 'order.%'\"; an evaluation error dead-letters the event."
    )


class RouteConfig(BaseModel):
    """One route: the events for which ``when`` holds (or, for the default route, those no
    other route took) go to every sink of ``sinks``."""

    model_config = _MODEL
    when: (
        Annotated[str, StringConstraints(min_length=1, max_length=10_000)] | SqlCondition | None
    ) = Field(
        default=None,
        description="A CEL boolean expression over the output event (as filter steps), or "
        "{sql: ...}, a CloudEvents SQL one; exactly one of when or default.",
    )
    default: bool = Field(
        default=False,
        description="The route of the events no 'when' route matched (at most one, the last).",
    )
    sinks: Annotated[list[SinkName], Field(min_length=1, max_length=32)] = Field(
        description="Names of spec.sinks the events go to; each one delivered and retried on its own. "
        "After an http sink with reply: true, the next sink gets that subscriber's replies "
        "instead of the event."
    )
    ordered: bool = Field(
        default=False,
        description="Keep per-key order at these sinks: a batch's sends to them wait for the "
        "previous batch's (else batches overlap, for throughput).",
    )

    @model_validator(mode="after")
    def _when_or_default(self) -> RouteConfig:
        if self.default and self.when is not None:
            msg = f"a route takes when or default: true, not both; got when {self.when!r} and default: true; drop one"
            raise ValueError(msg)
        if not self.default and self.when is None:
            msg = (
                'a route needs when (a CEL expression) or default: true; add when: "type == '
                "'...'\", or default: true for the events no other route takes"
            )
            raise ValueError(msg)
        return self


def _reply_of(sink: Any) -> bool:
    options = getattr(sink, "options", None)
    return bool(getattr(options, "reply", False))


def route_problems(
    routes: Sequence[RouteConfig] | None,
    sinks: Mapping[str, Any] | None,
    single: Any,
) -> list[str]:
    """Every problem of a spec's ``sink``/``sinks``/``routes``, one per line, each starting
    with its path (``routes[1].sinks[0]: ...``) and naming the value and the fix.

    Args:
        routes: ``spec.routes``.
        sinks: ``spec.sinks``.
        single: ``spec.sink``.
    """
    if single is not None and (sinks is not None or routes is not None):
        return [
            "sink: give either sink (one sink for every event) or sinks with routes; got both; "
            "move the sink into sinks under a name and route to it"
        ]
    if single is None and sinks is None:
        return [f"sink: {MISSING_SINK}"]
    if single is not None:
        if _reply_of(single):
            return [
                "sink.http.reply: reply: true sends the subscriber's replies to the next sink of "
                "a route, and a single sink has none; use sinks and routes, e.g. routes: "
                "[{default: true, sinks: [hook, replies]}]"
            ]
        return []
    assert sinks is not None
    if not sinks:
        return [
            "sinks: no sinks given; name at least one, e.g. sinks: {out: {kafka: {topic: out}}}"
        ]
    if not routes:
        names = ", ".join(sorted(sinks))
        return [
            f"routes: sinks ({names}) are given but no routes; add routes, e.g. routes: "
            f"[{{default: true, sinks: [{sorted(sinks)[0]}]}}]"
        ]
    problems: list[str] = []
    known = sorted(sinks)
    used: set[str] = set()
    defaults = [i for i, r in enumerate(routes) if r.default]
    if len(defaults) > 1:
        problems.append(
            f"routes[{defaults[1]}].default: routes[{defaults[0]}] is the default route already; "
            "keep one default route and merge their sinks"
        )
    elif defaults and defaults[0] != len(routes) - 1:
        problems.append(
            f"routes[{defaults[0]}].default: the default route must be the last route "
            f"(it takes what routes before and after it did not); move it after routes[{len(routes) - 1}]"
        )
    for i, route in enumerate(routes):
        if route.when is not None:
            problem = _cel_problem(route.when)
            if problem is not None:
                problems.append(f"routes[{i}].when: {problem}")
        seen: set[str] = set()
        for j, name in enumerate(route.sinks):
            where = f"routes[{i}].sinks[{j}]"
            if name not in sinks:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(
                    f"{where}: unknown sink {name!r}{hint}; the sinks are {', '.join(known)}: "
                    "name one of them or add it under spec.sinks"
                )
                continue
            if name in seen:
                problems.append(
                    f"{where}: sink {name!r} is named twice in this route; name it once"
                )
            seen.add(name)
            used.add(name)
            if _reply_of(sinks[name]) and j == len(route.sinks) - 1:
                problems.append(
                    f"{where}: sink {name!r} has reply: true but is the last sink of the route, "
                    "so its replies have nowhere to go; name the sink for its replies after it"
                )
    for name in known:
        if name not in used:
            problems.append(
                f"sinks.{name}: no route sends to sink {name!r}; add it to a route's sinks or remove it"
            )
    return problems


def loop_problems(outputs: Mapping[str, Any], pipeline: str) -> list[str]:
    """``pipeline:`` sinks naming their own pipeline (an endless loop), by path."""
    problems = []
    for path, sink in outputs.items():
        if getattr(sink, "kind", None) == "pipeline" and sink.options.name == pipeline:
            problems.append(
                f"{path}.pipeline: pipeline {pipeline!r} would send its outputs into its own "
                "ingress topic (an endless loop); name another pipeline"
            )
    return problems


def _cel_problem(source: str | SqlCondition) -> str | None:
    from eventbus import cel, cesql
    from eventbus.pipelines._activation import check_identifiers

    if isinstance(source, SqlCondition):
        try:
            cesql.compile(source.sql)
        except cesql.CESQLError as exc:
            return f"{exc.message} (line {exc.line}, column {exc.column} of the expression); got {source.sql!r}"
        return None
    try:
        check_identifiers(cel.compile(source))
    except cel.CELError as exc:
        message = exc.message if hasattr(exc, "message") else str(exc)
        column = f" (column {exc.column} of the expression)" if exc.column else ""
        return f"{message}{column}; got {source!r}"
    return None
