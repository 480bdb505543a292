"""EventBus: event-driven serverless pipelines on Ray Serve.

CloudEvents from Kafka (and, later, HTTP and gRPC) run through CEL filters and converts and
registered Python functions on Ray Serve replicas, and are delivered to sinks.

Example:
    >>> import eventbus
    >>> @eventbus.function
    ... def tag(event):
    ...     return event.replace(type="tagged")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from eventbus.errors import (
    ConfigError,
    DeployError,
    EventBusError,
    EventDecodeError,
    FunctionError,
    ModelError,
    ModelValidationError,
    PipelineConfigError,
    PipelineNotFoundError,
    StackError,
    StepError,
    UnknownComponentError,
)

if TYPE_CHECKING:
    from eventbus import cel
    from eventbus._client import AsyncClient, Client
    from eventbus.eventing._event import CloudEvent
    from eventbus.eventing._outcome import Failure
    from eventbus.functions import function

# imported on first use (PEP 562): `eventbus --help` and every CLI command start without the
# Kafka, HTTP and Ray clients the client and the event model bring in
_LAZY = {
    "AsyncClient": "eventbus._client",
    "Client": "eventbus._client",
    "CloudEvent": "eventbus.eventing._event",
    "Failure": "eventbus.eventing._outcome",
    "function": "eventbus.functions",
}


def __getattr__(name: str) -> Any:
    if name == "cel":
        return importlib.import_module("eventbus.cel")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eventbus' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Client",
    "CloudEvent",
    "ConfigError",
    "DeployError",
    "EventBusError",
    "EventDecodeError",
    "Failure",
    "FunctionError",
    "ModelError",
    "ModelValidationError",
    "PipelineConfigError",
    "PipelineNotFoundError",
    "StackError",
    "StepError",
    "UnknownComponentError",
    "__version__",
    "cel",
    "function",
]
