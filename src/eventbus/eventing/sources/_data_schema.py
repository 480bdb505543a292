"""JSON Schema validation of event data (an ``http``/``grpc`` source's ``data_schema``), with
RE2 regexes.

jsonschema runs ``pattern`` and ``patternProperties`` (and ``additionalProperties`` next to
them) with Python's backtracking ``re``: ``^([a-zA-Z0-9]+)*@example\\.com$`` against 24 letters
and a ``!`` took 0.9 s per request on the gateway's only loop. Here those keywords match with
RE2 (``google-re2``), in time linear in the input. RE2 has no backreferences or lookaround:
a schema using them is refused when the pipeline is validated or deployed, naming the
pattern. ``format`` is not asserted (no format checker), so ``format: regex`` never runs a
regex on data. ``unevaluatedProperties`` beside ``patternProperties`` is refused too:
jsonschema evaluates that pair with ``re`` internally.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend

from eventbus._internal.re2_adapter import compile_search

__all__ = ["DataValidator", "SchemaPatternError", "check_data_schema", "data_validator"]

# Keywords whose values are data, not schemas: never searched for patterns.
_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))


class SchemaPatternError(ValueError):
    """A schema pattern RE2 cannot compile (the message names it)."""


@functools.lru_cache(maxsize=4096)
def _matcher(pattern: str) -> Any:
    search, reason = compile_search(pattern)
    if search is None:
        reason = reason[:120]
        shown = pattern if len(pattern) <= 80 else pattern[:80] + "..."
        msg = (
            f"pattern {shown!r} is not an RE2 regular expression ({reason}); data_schema "
            "patterns run with RE2 (no backreferences or lookaround, linear time), see "
            "https://github.com/google/re2/wiki/Syntax"
        )
        raise SchemaPatternError(msg)
    return search


def _search(pattern: str, text: str) -> bool:
    return bool(_matcher(pattern)(text))


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        shown = instance if len(instance) <= 80 else instance[:80] + "..."
        yield ValidationError(f"{shown!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for k, v in instance.items():
            if _search(pattern, k):
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = [
        k for k in instance if k not in properties and not any(_search(p, k) for p in patterns)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        names = ", ".join(repr(k) for k in sorted(extras)[:10])
        if patterns:
            listed = ", ".join(repr(p) for p in sorted(patterns))
            yield ValidationError(f"{names} do(es) not match any of the regexes: {listed}")
        else:
            yield ValidationError(f"Additional properties are not allowed ({names} unexpected)")


#: Draft 2020-12 with the regex keywords on RE2.
DataValidator: Any = extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)


def _walk(schema: Any) -> Iterator[tuple[str, Any]]:
    # (keyword, value) of every schema object in a schema, data-valued keywords skipped.
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in _DATA_KEYWORDS:
                continue
            yield key, value
            if key == "properties" and isinstance(value, dict):
                for sub in value.values():  # property names are not keywords
                    yield from _walk(sub)
            else:
                yield from _walk(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _walk(item)


def check_data_schema(schema: dict[str, Any]) -> None:
    """Refuse what :data:`DataValidator` cannot run in linear time.

    Raises:
        ValueError: naming the pattern RE2 cannot compile, or the keyword pair refused.
    """
    unevaluated = pattern_properties = False
    for key, value in _walk(schema):
        if key == "pattern" and isinstance(value, str):
            _matcher(value)
        elif key == "patternProperties" and isinstance(value, dict):
            pattern_properties = True
            for pattern in value:
                _matcher(pattern)
        elif key == "unevaluatedProperties":
            unevaluated = True
    if unevaluated and pattern_properties:
        msg = (
            "data_schema uses unevaluatedProperties and patternProperties together, which "
            "jsonschema evaluates with backtracking regexes; use additionalProperties instead"
        )
        raise SchemaPatternError(msg)


def data_validator(schema: dict[str, Any]) -> Any:
    """A validator of event data against ``schema`` (checked with :func:`check_data_schema`)."""
    check_data_schema(schema)
    return DataValidator(schema)
