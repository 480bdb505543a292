"""The registry's error, in Confluent's shape: an HTTP status and an ``error_code``.

The codes are Confluent Schema Registry's (``io.confluent.kafka.schemaregistry.rest.exceptions``),
so its clients (``SchemaRegistryClient``, the serializers) react to them as they do to
Confluent's: 40401 subject not found, 40402 version not found, 40403 schema not found,
40404 subject soft-deleted, 40405 subject not soft-deleted first, 40406 version soft-deleted,
40407 version not soft-deleted first, 40408 no subject-level compatibility, 409 incompatible
schema, 42201 invalid schema, 42202 invalid version, 42203 invalid compatibility level,
50001 the backing store failed, 50002 it timed out.
"""

from __future__ import annotations

from eventbus.errors import EventBusError

__all__ = ["SchemaRegistryError"]


class SchemaRegistryError(EventBusError):
    """A request the registry refuses, as ``{"error_code": code, "message": message}``.

    Args:
        status: the HTTP status.
        code: Confluent's ``error_code`` (40401, 409, 42201, ...).
        message: what was wrong and the fix.

    Example:
        >>> e = SchemaRegistryError(404, 40401, "Subject 'x' not found.")
        >>> e.code
        40401
    """

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(status, code, message)
        self.status = status
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, object]:
        """The JSON body Confluent's clients parse."""
        return {"error_code": self.code, "message": self.message}


def subject_not_found(subject: str) -> SchemaRegistryError:
    return SchemaRegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: object) -> SchemaRegistryError:
    return SchemaRegistryError(404, 40402, f"Version {version} not found for subject '{subject}'.")


def schema_not_found(what: str) -> SchemaRegistryError:
    return SchemaRegistryError(404, 40403, f"Schema {what} not found.")


def invalid_schema(why: str) -> SchemaRegistryError:
    return SchemaRegistryError(422, 42201, f"Invalid schema: {why}")
