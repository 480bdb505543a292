"""Runtime routing of a pipeline: its ``sinks:`` built and its ``routes:`` compiled.

The routes' ``when`` expressions compile once, here, into predicates (CEL closures, as filter
steps); :class:`~eventbus.eventing._routing.Routing` applies them per output event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventbus import cel, cesql
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._routing import Route, Routing
from eventbus.pipelines._activation import activation_builder
from eventbus.pipelines._config import PipelineConfig, SinkConfig
from eventbus.pipelines._routes_config import SqlCondition
from eventbus.pipelines.steps._values import compile_cel

__all__ = ["build_routing", "route_predicate"]


def route_predicate(source: str | SqlCondition) -> Callable[[CloudEvent], bool]:
    """A route's ``when`` as a predicate; an expression that gives no bool raises CELError
    (CESQLError for ``{sql: ...}``, as does its evaluation error): the event's input is
    dead-lettered, naming the route."""
    if isinstance(source, SqlCondition):
        matches = cesql.compile(source.sql).matches
        return lambda event: matches(event.attributes)
    program = compile_cel(source)
    build = activation_builder(program.variables)
    evaluate = program.evaluate

    def when(event: CloudEvent) -> bool:
        result = evaluate(build(event))
        if result is True or result is False:
            return result
        msg = f"expression {source!r} gave {result!r} ({type(result).__name__}); a route's when must give a bool"
        raise cel.CELError(msg)

    return when


def build_routing(config: PipelineConfig, make: Callable[[SinkConfig], Any]) -> Routing | None:
    """The pipeline's named sinks (built by ``make``) and compiled routes; None for a
    pipeline with a single ``sink``."""
    spec = config.spec
    if spec.routes is None or spec.sinks is None:
        return None
    built = {name: make(sink) for name, sink in spec.sinks.items()}
    routes = []
    for i, r in enumerate(spec.routes):
        replies = {
            name: r.sinks[j + 1]
            for j, name in enumerate(r.sinks[:-1])
            if getattr(spec.sinks[name].options, "reply", False)
        }
        when = None if r.when is None else route_predicate(r.when)
        routes.append(Route(f"routes[{i}]", tuple(r.sinks), when, r.ordered, replies))
    return Routing(built, routes)
