"""EventBridge event patterns (``filter: {pattern: {...}}``), compiled once into a matcher.

The event as a pattern sees it: the top-level keys are the CloudEvent's attributes (``type``,
``source``, ``subject``, ``id``, ``time``, extensions, ...) and ``data`` is its payload, so
EventBridge's ``{"source": [...], "detail": {...}}`` reads ``{"source": [...], "data":
{...}}``. EventBridge's names work too: ``detail-type`` is ``type`` and ``detail`` is
``data``. A field's value is a list of conditions (see :mod:`._pattern_values`) or an object
of nested fields; ``$or`` takes a list of two or more patterns, one of which must match.
Arrays in the event match when any element does; fields under an array of objects must match
within one element (event-ruler's array consistency).

A malformed pattern raises :class:`PatternError` with the path inside the pattern, the value
and the fix; :func:`validate_pattern` turns it into a pydantic error at that path, so
``eventbus validate`` reports it at its line and column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from eventbus.eventing._event import CloudEvent
from eventbus.pipelines.steps._pattern_values import (
    MISSING,
    OPERATORS,
    Leaf,
    PatternError,
    compile_leaf,
)

__all__ = [
    "MAX_PATTERN_DEPTH",
    "Node",
    "PatternError",
    "compile_event_pattern",
    "compile_pattern",
    "parse_pattern",
    "pattern_problems",
    "validate_pattern",
]

#: Nested objects (and ``$or`` levels) a pattern may hold; deeper is an error, not a
#: RecursionError.
MAX_PATTERN_DEPTH = 64
#: EventBridge's names for CloudEvents attributes, at the top level of a pattern.
ALIASES = {"detail-type": "type", "detail": "data"}

Loc = tuple[int | str, ...]
Matcher = Callable[[Any], bool]
_EMPTY: dict[str, Any] = {}


def compile_pattern(pattern: Any) -> Matcher:
    """A predicate over a JSON document (a dict) for an EventBridge pattern, as event-ruler's
    ``Ruler.matchesRule`` matches one.

    >>> compile_pattern({"detail": {"state": [{"anything-but": "stopped"}]}})({"detail": {"state": "running"}})
    True

    Raises:
        PatternError: the pattern is malformed (``loc`` the path inside it).
    """
    from eventbus.pipelines.steps._pattern_codegen import generate

    return generate(parse_pattern(pattern), event=False)


def compile_event_pattern(pattern: Any) -> Callable[[CloudEvent], bool]:
    """A predicate over CloudEvents: top-level keys are attributes, ``data`` the payload
    (``detail-type``/``detail`` accepted as EventBridge's names for ``type``/``data``).

    Raises:
        PatternError: the pattern is malformed (``loc`` the path inside it).
    """
    from eventbus.pipelines.steps._pattern_codegen import generate

    return generate(parse_pattern(pattern), event=True)


def parse_pattern(pattern: Any) -> Node:
    """The pattern, checked and parsed (see :class:`Node`).

    Raises:
        PatternError: the pattern is malformed (``loc`` the path inside it).
    """
    errors: list[PatternError] = []
    node = _parse(pattern, (), 0, errors)
    if errors:
        raise errors[0]
    return node


def pattern_problems(pattern: Any) -> list[PatternError]:
    """Every problem of a pattern (each field is checked even when a sibling is bad), in
    the order they appear; empty when the pattern is good."""
    errors: list[PatternError] = []
    _parse(pattern, (), 0, errors)
    return errors


@dataclass(frozen=True)
class Node:
    """One object of a pattern, parsed: its fields (a :class:`Leaf` of conditions or a
    nested :class:`Node`) and its ``$or`` groups. The matchers are closures; the code
    generator inlines what it can and calls these for the rest."""

    fields: tuple[tuple[str, Leaf | Node], ...]
    ors: tuple[tuple[Node, ...], ...]

    @cached_property
    def match_object(self) -> Callable[[dict[str, Any]], bool]:
        """The predicate over one event object (a dict)."""
        checks = tuple((key, sub.match) for key, sub in self.fields)
        groups = tuple(tuple(alt.match_object for alt in g) for g in self.ors)
        if not groups and len(checks) == 1:
            key, check = checks[0]
            return lambda d: check(d.get(key, MISSING))

        def match(d: dict[str, Any]) -> bool:
            for key, check in checks:
                if not check(d.get(key, MISSING)):
                    return False
            return all(any(alt(d) for alt in group) for group in groups)

        return match

    @cached_property
    def match(self) -> Matcher:
        """The predicate over a field's value: an object matches itself; an array matches
        when one of its objects (nested arrays flattened) does, or, holding no objects, as an
        object without fields (so ``exists: false`` holds); anything else is an object
        without fields."""
        match = self.match_object

        def value(v: Any) -> bool:
            t = type(v)
            if t is dict:
                return match(v)
            if t is list:
                objects = _objects(v)
                if not objects:
                    return match(_EMPTY)
                return any(match(o) for o in objects)
            return match(_EMPTY)

        return value

    @cached_property
    def match_event(self) -> Callable[[CloudEvent], bool]:
        """The predicate over a CloudEvent, this node being a whole pattern."""
        checks = tuple((ALIASES.get(k, k), sub.match) for k, sub in self.fields)
        groups = tuple(tuple(alt.match_event for alt in g) for g in self.ors)

        def match(e: CloudEvent) -> bool:
            attrs = e.attributes
            for key, check in checks:
                if not check(e.data if key == "data" else attrs.get(key, MISSING)):
                    return False
            return all(any(alt(e) for alt in group) for group in groups)

        return match


def validate_pattern(pattern: dict[str, Any]) -> dict[str, Any]:
    """Pydantic after-validator: compile the pattern, raising a validation error at the
    offending path inside it (so ``eventbus validate`` reports its line and column)."""
    problems = pattern_problems(pattern)
    if problems:
        details = [
            InitErrorDetails(
                type=PydanticCustomError("value_error", "{message}", {"message": p.message}),
                loc=p.loc,
                input=p.value,
            )
            for p in problems
        ]
        raise ValidationError.from_exception_data("pattern", details)
    return pattern


def _parse(pattern: Any, loc: Loc, depth: int, errors: list[PatternError]) -> Node:
    """The node for one pattern object; a bad field's error is added to ``errors`` and the
    other fields are still checked (a bad object as a whole raises)."""
    if depth > MAX_PATTERN_DEPTH:
        msg = (
            f"the pattern nests deeper than {MAX_PATTERN_DEPTH} levels; flatten it "
            "(match fewer levels of the event, or use a cel filter)"
        )
        raise PatternError(msg, loc, None)
    if not isinstance(pattern, dict):
        msg = f"a pattern is an object of fields; got {pattern!r} ({type(pattern).__name__})"
        raise PatternError(msg, loc, pattern)
    if not pattern:
        msg = "an empty object matches nothing here; name at least one field (or remove it)"
        raise PatternError(msg, loc, pattern)
    fields: list[tuple[str, Leaf | Node]] = []
    ors: list[tuple[Node, ...]] = []
    for key, value in pattern.items():
        try:
            _field(key, value, loc, depth, errors, fields, ors)
        except PatternError as exc:
            errors.append(exc)
    return Node(tuple(fields), tuple(ors))


def _field(
    key: Any,
    value: Any,
    loc: Loc,
    depth: int,
    errors: list[PatternError],
    fields: list[tuple[str, Leaf | Node]],
    ors: list[tuple[Node, ...]],
) -> None:
    """Parse one field of a pattern object into ``fields`` or ``ors``."""
    at = (*loc, key)
    if not isinstance(key, str):
        msg = f"field names are strings; got {key!r} (quote it in YAML)"
        raise PatternError(msg, at, key)
    if key == "$or":
        if not isinstance(value, list) or len(value) < 2:
            msg = (
                f"$or takes a list of two or more patterns; got {value!r} (a single "
                "pattern's fields belong in the enclosing object)"
            )
            raise PatternError(msg, at, value)
        ors.append(tuple(_parse(alt, (*at, i), depth + 1, errors) for i, alt in enumerate(value)))
    elif isinstance(value, list):
        fields.append((key, compile_leaf(value, at)))
    elif isinstance(value, dict):
        fields.append((key, _parse(value, at, depth + 1, errors)))
    elif key in OPERATORS:
        field = loc[-1] if loc and isinstance(loc[-1], str) else "field"
        msg = (
            f"{key!r} is an operator: conditions go in a list under the field, e.g. "
            f"{field}: [{{{key!r}: {value!r}}}]"
        )
        raise PatternError(msg, at, value)
    else:
        msg = (
            f"a field takes a list of values/conditions or an object of nested fields; "
            f"got {value!r}: write [{value!r}]"
        )
        raise PatternError(msg, at, value)


def _objects(v: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    stack = [iter(v)]
    while stack:
        for x in stack[-1]:
            if type(x) is list:
                stack.append(iter(x))
                break
            if type(x) is dict:
                out.append(x)
        else:
            stack.pop()
    return out
