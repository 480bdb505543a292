"""Helpers the step kinds share: CEL compilation, JSON-able values, attribute checks, paths."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import ConfigDict, StringConstraints

from eventbus import cel
from eventbus.eventing._event import CloudEvent, format_time
from eventbus.pipelines._activation import check_identifiers

__all__ = [
    "CONFIG",
    "CelSource",
    "attribute_value",
    "compile_cel",
    "json_value",
    "remove_path",
    "set_path",
]

#: Every step config model: unknown fields rejected, immutable.
CONFIG = ConfigDict(extra="forbid", frozen=True)
#: A CEL expression in YAML.
CelSource = Annotated[str, StringConstraints(min_length=1)]


def compile_cel(source: str) -> cel.Program:
    """Compile a CEL expression of a step, rejecting unknown variables (typos)."""
    program = cel.compile(source)
    check_identifiers(program)
    return program


def json_value(value: Any) -> Any:
    """CEL values that JSON cannot hold, in their CEL/JSON string forms."""
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return value


def attribute_value(name: str, value: Any) -> Any:
    """``value`` checked as the CloudEvent attribute ``name`` (times formatted)."""
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


def set_path(data: Any, keys: list[str], value: Any, copied: set[int], e: CloudEvent) -> Any:
    """``data`` with ``keys`` set to ``value``, copying (once, tracked in ``copied``) every
    mapping on the way so the input event is never changed."""
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


def remove_path(data: Any, keys: list[str], copied: set[int]) -> Any:
    """``data`` without ``keys`` (copying as :func:`set_path` does)."""
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
