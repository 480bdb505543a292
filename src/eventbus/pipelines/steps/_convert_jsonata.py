"""``convert: {jsonata: "..."}``: the event rewritten by a JSONata expression, as Knative's
EventTransform does: the expression sees the whole event (its attributes, and ``data``) and
produces the whole new event (attributes beside ``data``)."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any

from eventbus import jsonata
from eventbus.eventing._event import CloudEvent
from eventbus.pipelines.steps._values import attribute_value

__all__ = ["jsonata_converter"]

_NAME = re.compile(r"^[a-z0-9]{1,20}$")
_PLAIN = (str, int, bool)


def _as_input(e: CloudEvent) -> dict[str, Any]:
    doc = dict(e.attributes)
    if isinstance(e.data, bytes):
        doc["data_base64"] = base64.b64encode(e.data).decode("ascii")
    elif e.data is not None:
        doc["data"] = e.data
    return doc


def _as_event(result: Any) -> CloudEvent:
    if not isinstance(result, dict):
        shown = "nothing" if result is jsonata.UNDEFINED else repr(result)[:80]
        msg = (f"the jsonata expression must produce the new event as an object (attributes and "
               f"'data', as Knative's EventTransform); it gave {shown}")  # fmt: skip
        raise ValueError(msg)
    missing = [k for k in ("id", "source", "type") if k not in result]
    if missing:
        msg = f'the jsonata result lacks the required attribute(s) {missing}; copy them, e.g. "id": id'
        raise ValueError(msg)
    version = result.get("specversion", "1.0")
    if version != "1.0":
        msg = f"the jsonata result's specversion must be '1.0'; got {version!r}"
        raise ValueError(msg)
    attrs: dict[str, Any] = {"specversion": "1.0"}
    data: Any = None
    for name, value in result.items():
        if name == "data":
            data = value
        elif name == "data_base64":
            data = base64.b64decode(value) if isinstance(value, str) else value
        elif name != "specversion":
            if not _NAME.match(name):
                msg = f"attribute name {name!r} from the jsonata result must be 1-20 lowercase letters or digits"
                raise ValueError(msg)
            if value is None:
                continue  # a null attribute is an absent one
            attrs[name] = (
                value if value.__class__ is str and value else attribute_value(name, value)
            )
    if data is not None and "datacontenttype" not in attrs and not isinstance(data, bytes):
        attrs["datacontenttype"] = "application/json"
    return CloudEvent(attrs, data)


def jsonata_converter(
    source: str, budget: jsonata.Budget | None = None
) -> Callable[[CloudEvent], CloudEvent]:
    """Compile ``source`` once; the returned function converts one event.

    Raises:
        JSONataError: ``source`` does not compile (with the position).
    """
    expr = jsonata.compile(source)
    limits = budget or jsonata.Budget()

    def convert(e: CloudEvent) -> CloudEvent:
        return _as_event(expr.evaluate(_as_input(e), None, limits))

    return convert
