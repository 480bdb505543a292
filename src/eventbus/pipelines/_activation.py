"""What a CEL expression sees of a CloudEvent, and the static identifier check.

Variables: each context attribute by name (``type``, ``source``, ``id``, ``subject``,
``time`` as a timestamp, ``datacontenttype``, extensions such as ``partitionkey``), ``data``
(the parsed JSON data) and ``event`` (a map of every attribute plus ``data``, so that
``has(event.subject)`` tests for an optional attribute).

``type`` resolves to the CloudEvent attribute when written as a bare identifier; the call
form ``type(x)`` is CEL's builtin type function.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

from eventbus import cel
from eventbus.eventing._event import CloudEvent, parse_time

__all__ = ["KNOWN_VARIABLES", "activation_builder", "check_identifiers"]

KNOWN_VARIABLES = frozenset(
    {
        "specversion",
        "id",
        "source",
        "type",
        "subject",
        "time",
        "datacontenttype",
        "dataschema",
        "data",
        "event",
    }
)
_EXTENSION = re.compile(r"^[a-z0-9]{1,20}$")


def check_identifiers(program: cel.Program) -> None:
    """Reject identifiers that cannot be attributes, and likely typos of known variables.

    Raises:
        cel.CELError: naming the identifier and the fix.
    """
    for name in sorted(program.variables - KNOWN_VARIABLES):
        close = difflib.get_close_matches(name, sorted(KNOWN_VARIABLES), n=1, cutoff=0.75)
        if close:
            msg = (
                f"unknown variable {name!r} (did you mean {close[0]!r}?); to read an extension "
                f"attribute of that name write event.{name}"
            )
            raise cel.CELError(msg)
        if not _EXTENSION.match(name):
            msg = (
                f"unknown variable {name!r}: variables are the CloudEvent attributes "
                f"({', '.join(sorted(KNOWN_VARIABLES - {'data', 'event'}))}, extensions: "
                "lowercase letters and digits), 'data' and 'event'"
            )
            raise cel.CELError(msg)


def activation_builder(variables: frozenset[str]) -> Callable[[CloudEvent], dict[str, Any]]:
    """A function building the variables for one event, materialising only what is used."""
    needs_time = "time" in variables
    needs_event = "event" in variables
    if variables <= {"data"}:
        return lambda e: {"data": e.data}
    if not needs_time and not needs_event:

        def build(e: CloudEvent) -> dict[str, Any]:
            act = dict(e.attributes)
            act["data"] = e.data
            return act

        return build

    def build_full(e: CloudEvent) -> dict[str, Any]:
        act = dict(e.attributes)
        t = act.get("time")
        if type(t) is str:
            act["time"] = parse_time(t)
        act["data"] = e.data
        if needs_event:
            act["event"] = dict(act)
        return act

    return build_full
