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

from eventbus import cel
from eventbus._client import AsyncClient, Client
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
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.functions import function

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
