"""The EventBus exception tree.

Every error EventBus raises on purpose derives from :class:`EventBusError`; errors caused by
user input also derive from the matching stdlib type so plain ``except ValueError`` works::

    EventBusError
    ├── ConfigError (ValueError)              bad configuration value
    │   ├── PipelineConfigError               pipeline YAML problems, positional, all at once
    │   └── UnknownComponentError (LookupError)  unknown source/sink/step/function name
    ├── FunctionError (ValueError)            a user function cannot be imported or has a bad signature
    ├── EventDecodeError (ValueError)         a transport message is not a valid CloudEvent
    ├── StepError                             a step failed on one event (pipeline and step id inside)
    ├── PipelineNotFoundError (LookupError)   no deployed pipeline of that name
    ├── DeployError                           a deployment could not be completed
    ├── SolverError (ValueError)              an allocation problem or solver option is invalid
    ├── ModelError (ValueError)               a model artifact, version or input is unusable
    │   └── ModelValidationError              a new model version failed validation (not swapped in)
    ├── IngressError                          the gateway refuses a request (HTTP status inside)
    ├── StateUnavailableError                 step state (Redis) unreachable: the batch is retried
    └── StackError (RuntimeError)             the local stack (Ray, broker, Redis) is unusable

Errors crossing Ray actors pass every constructor argument to ``super().__init__`` so that they
pickle (see Ray's ``serve/exceptions.py: BackPressureError``).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DeployError",
    "EventBusError",
    "EventDecodeError",
    "FunctionError",
    "IngressError",
    "ModelError",
    "ModelValidationError",
    "ModelWakeError",
    "PipelineConfigError",
    "PipelineNotFoundError",
    "SolverError",
    "StackError",
    "StateUnavailableError",
    "StepError",
    "UnknownComponentError",
]


class EventBusError(Exception):
    """Root of every error EventBus raises on purpose."""


class ConfigError(EventBusError, ValueError):
    """A configuration value is invalid; the message names the value and the fix."""


class PipelineConfigError(ConfigError):
    """A pipeline document has problems.

    Args:
        problems: one line per problem, ``file:line:col: path: message``.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems)
        self.problems = list(problems)

    def __str__(self) -> str:
        return "\n".join(self.problems)


class UnknownComponentError(ConfigError, LookupError):
    """A component (source, sink, step template, function) name is not registered."""


class FunctionError(EventBusError, ValueError):
    """A user function cannot be imported, or its signature does not fit a step."""


class EventDecodeError(EventBusError, ValueError):
    """A transport message could not be decoded into a CloudEvent."""


class StepError(EventBusError):
    """A pipeline step failed on one event.

    Args:
        pipeline: the pipeline name.
        step: the step id.
        error_type: the type name of the underlying exception.
        message: the underlying exception's message.
    """

    def __init__(self, pipeline: str, step: str, error_type: str, message: str) -> None:
        super().__init__(pipeline, step, error_type, message)
        self.pipeline = pipeline
        self.step = step
        self.error_type = error_type
        self.message = message

    def __str__(self) -> str:
        return f"{self.pipeline}.{self.step}: {self.error_type}: {self.message}"


class PipelineNotFoundError(EventBusError, LookupError):
    """No pipeline of that name is deployed."""


class DeployError(EventBusError):
    """A deployment could not be completed; nothing half-deployed is left serving."""


class IngressError(EventBusError):
    """The gateway refuses a request; ``status`` is the HTTP status (gRPC maps it).

    Args:
        status: the HTTP status code (400, 401, 403, 404, 413, 422, 503, 504).
        message: what is wrong and how to fix it (never a secret).
        retry_after_s: when to try again (the ``Retry-After`` header of a 503), if known.
    """

    def __init__(self, status: int, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(status, message, retry_after_s)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return self.message


class SolverError(EventBusError, ValueError):
    """An allocation problem, a dual vector or a solver option is invalid; the message names the fix."""


class ModelError(EventBusError, ValueError):
    """A model artifact does not load, a model or version is unknown, or an input does not fit."""


class ModelValidationError(ModelError):
    """A new model version failed validation; the serving version is unchanged.

    Args:
        model: the model name.
        version: the rejected version.
        reason: what failed (non-finite outputs, wrong shape, accuracy below the threshold).
    """

    def __init__(self, model: str, version: int, reason: str) -> None:
        super().__init__(model, version, reason)
        self.model = model
        self.version = version
        self.reason = reason

    def __str__(self) -> str:
        return f"model {self.model!r} version {self.version} was rejected and not swapped in: {self.reason}"


class ModelWakeError(ModelError):
    """A model application scaled to zero did not come back within the caller's deadline (or
    its wake failed). Retriable: the events fail this attempt and go through the step's
    retries and the pipeline's dead-letter path like any failed call; a later call asks for
    the wake again."""


class StateUnavailableError(EventBusError):
    """A step's state store (Redis) does not answer: the whole batch is dispatched again
    later instead of failing its events."""


class StackError(EventBusError, RuntimeError):
    """The local stack (Ray, the Kafka-protocol broker, Redis) could not be started or reached."""
