"""JSON Schema in the Confluent wire format (``value_format: json_schema``): a zero byte, the
4-byte big-endian schema id, the JSON document (UTF-8), as confluent-kafka's
``JSONSerializer`` writes it.

The source's :class:`JsonSchemaWireDecoder` fetches the schema by id (cached, as Avro's),
parses the document and validates it; the sink's :class:`JsonSchemaWireEncoder` validates each
event's data before it frames it. A document that is not JSON or does not fit names where
(its JSON path) and the rule that failed (``required``, ``type``, ``maximum``, ...): its
record or event is dead-lettered with that reason.
"""

from __future__ import annotations

import json
from typing import Any

from eventbus.errors import EventDecodeError
from eventbus.eventing._confluent_avro import WireDecoder
from eventbus.eventing._registry_subject import SinkEncodeError, SinkSchemaError, SubjectEncoder

__all__ = [
    "JsonSchemaEncodeError",
    "JsonSchemaError",
    "JsonSchemaWireDecoder",
    "JsonSchemaWireEncoder",
    "json_schema_validator",
    "why_invalid",
]

_HEADER = 5


class JsonSchemaEncodeError(SinkEncodeError):
    """An event's data does not fit the sink's JSON Schema (its dead letter names why)."""


class JsonSchemaError(SinkSchemaError):
    """The registry refused the sink's subject, version or JSON Schema."""


def json_schema_validator(schema: Any) -> Any:
    """A jsonschema validator of ``schema`` (JSON text or parsed), its draft from ``$schema``
    (draft 2020-12 when absent).

    Raises:
        ValueError: not JSON, or not a valid JSON Schema; the message says where.
    """
    import jsonschema
    from jsonschema.validators import validator_for

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as e:
            msg = f"the JSON Schema is not JSON: {e}"
            raise ValueError(msg) from None
    if not isinstance(schema, (dict, bool)):
        msg = f"a JSON Schema is an object or a boolean; got {type(schema).__name__}"
        raise ValueError(msg)
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)  # type: ignore[arg-type]
    except jsonschema.SchemaError as e:
        where = "/".join(map(str, e.absolute_path)) or "(root)"
        msg = f"not a valid JSON Schema at {where}: {e.message[:300]}"
        raise ValueError(msg) from None
    except RecursionError:
        msg = "the JSON Schema nests too deeply to check"
        raise ValueError(msg) from None
    return cls(schema)


def why_invalid(validator: Any, doc: Any) -> str | None:
    """Why ``doc`` fails ``validator`` (JSON path, the failed rule, the message); None: valid."""
    from jsonschema.exceptions import best_match

    from eventbus._internal.recursion import ensure_headroom

    # the validator recurses a few frames a level and orjson parses at most 1024 levels: with
    # the shared headroom every document the source accepts is walked whole, whatever ran first
    ensure_headroom()
    try:
        error = best_match(validator.iter_errors(doc))
    except RecursionError:
        return "the document nests deeper than it can be validated"
    if error is None:
        return None
    message = error.message if len(error.message) <= 300 else error.message[:280] + " ... (cut)"
    path = error.json_path
    if len(path) > 200:
        path = f"{path[:90]}...{path[-90:]} ({len(error.absolute_path)} levels)"
    return f"at {path}: {error.validator!r} failed: {message}"


class JsonSchemaWireDecoder(WireDecoder):
    """Decode and validate Confluent-framed JSON values with schemas from a registry.

    Example:
        >>> JsonSchemaWireDecoder("http://127.0.0.1:8081").schema_id(b"\\x00\\x00\\x00\\x00\\x07{}")
        7
    """

    kind = "JSON Schema"

    def parse(self, body: dict[str, Any]) -> Any:
        if (body.get("schemaType") or "AVRO") != "JSON":
            msg = f"a {body.get('schemaType') or 'AVRO'} schema, not JSON"
            raise ValueError(msg)
        return json_schema_validator(body["schema"])

    def decode_body(self, sid: int, schema: Any, value: bytes) -> Any:
        import orjson

        try:
            doc = orjson.loads(value[_HEADER:])
        except orjson.JSONDecodeError as e:
            msg = f"the body of schema id {sid} is not JSON: {e}"
            raise EventDecodeError(msg) from None
        why = why_invalid(schema, doc)
        if why is not None:
            raise EventDecodeError(f"the document does not fit schema id {sid}: {why}")
        return doc

    def json_value(self, value: bytes | None) -> bytes:
        """The record's JSON document, validated (the bytes as they came)."""
        self.decode(value)
        assert value is not None
        return value[_HEADER:]


class JsonSchemaWireEncoder(SubjectEncoder):
    """Encode event data as Confluent-framed JSON under a registry subject, validated against
    its JSON Schema (see :class:`~eventbus.eventing._registry_subject.SubjectEncoder`)."""

    schema_type = "JSON"
    kind = "JSON Schema"
    content_type = b"application/json"
    encode_error = JsonSchemaEncodeError
    schema_error = JsonSchemaError

    def __init__(self, registry_url: str, subject: str, **kw: Any) -> None:
        super().__init__(registry_url, subject, **kw)
        self._validator: Any = None

    def load(self, schema: Any) -> None:
        self._validator = json_schema_validator(schema)

    def encode_datum(self, datum: Any) -> bytes:
        """``datum`` framed: magic byte, schema id, the JSON document.

        Raises:
            JsonSchemaEncodeError: the datum does not fit (its JSON path and the failed rule).
            RuntimeError: :meth:`resolve` was not called.
        """
        import orjson

        if self._validator is None:
            msg = f"JSON Schema subject {self.subject!r}: resolve() the schema id first"
            raise RuntimeError(msg)
        why = why_invalid(self._validator, datum)
        if why is not None:
            raise self.error(why)
        try:
            return self.header + orjson.dumps(datum)
        except (TypeError, orjson.JSONEncodeError) as e:
            raise self.error(f"not JSON: {e}") from None
