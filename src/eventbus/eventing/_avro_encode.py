"""Avro out, in the Confluent wire format: the Kafka sink's ``value_format: avro``.

An :class:`AvroWireEncoder` learns its schema id from the registry once (the subject's pinned
``version``, or the inline schema looked up under the subject and registered when missing),
then writes each event's ``data`` as a zero byte, the 4-byte big-endian schema id and the
Avro binary body (fastavro's schemaless writer). The registry calls go through the same
:class:`~eventbus.eventing._confluent_avro.RegistryClient` as the source's decoder.

Data that does not fit the schema raises :class:`AvroEncodeError` naming the field, the
value and the type the schema expects: its event is dead-lettered with that reason. A
registry that cannot be reached raises ``RegistryUnavailableError`` (an infrastructure
error: the batch waits and is retried); a subject, version or schema the registry refuses
raises :class:`AvroSchemaError` (a configuration error).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from decimal import Decimal, InvalidOperation
from typing import Any

from eventbus.eventing._registry_subject import (
    MAX_SCHEMA_ID,
    SinkEncodeError,
    SinkSchemaError,
    SubjectEncoder,
)

__all__ = [
    "MAX_SCHEMA_ID",
    "AvroEncodeError",
    "AvroSchemaError",
    "AvroWireEncoder",
    "parse_avro_schema",
]


class AvroEncodeError(SinkEncodeError):
    """An event's data does not fit the sink's Avro schema (its dead letter names why)."""


class AvroSchemaError(SinkSchemaError):
    """The registry refused the sink's subject, version or schema."""


def parse_avro_schema(schema: Any) -> Any:
    """``schema`` (a JSON string or its parsed form) parsed by fastavro.

    Raises:
        ValueError: not JSON, or not an Avro schema; the message says which.
    """
    import fastavro

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            msg = f"the Avro schema is not JSON: {e}"
            raise ValueError(msg) from None
    try:
        return fastavro.parse_schema(schema)
    except RecursionError:
        msg = "the Avro schema nests too deeply to parse"
        raise ValueError(msg) from None
    except Exception as e:  # noqa: BLE001 - fastavro raises several kinds for a bad schema
        msg = f"not an Avro schema: {type(e).__name__}: {e}"
        raise ValueError(msg) from None


class AvroWireEncoder(SubjectEncoder):
    """Encode event data as Confluent-framed Avro under a registry subject (see
    :class:`~eventbus.eventing._registry_subject.SubjectEncoder` for the arguments).

    Example:
        >>> enc = AvroWireEncoder("http://127.0.0.1:8081", "pay-value", version=1)
        >>> # await enc.resolve(); enc.encode_datum({"amount": 5}) -> b"\\x00\\x00\\x00\\x00\\x01\\x0a"
    """

    encode_error = AvroEncodeError
    schema_error = AvroSchemaError

    def __init__(self, registry_url: str, subject: str, **kw: Any) -> None:
        super().__init__(registry_url, subject, **kw)
        self._parsed: Any = None
        self._named: dict[str, Any] = {}
        self._converts = False
        self._plans: dict[int, Any] = {}  # id(record schema) -> its fields to convert

    def load(self, schema: Any) -> None:
        import fastavro

        named: dict[str, Any] = {}
        parsed = fastavro.parse_schema(json.loads(schema), named_schemas=named)
        self._parsed, self._named = parsed, named
        self._converts = _needs_conversion(parsed, named, set())

    def encode_datum(self, datum: Any) -> bytes:
        """``datum`` framed: magic byte, schema id, Avro body.

        JSON forms are taken where the schema wants another type: base64 text for
        ``bytes``/``fixed`` (as the Avro source writes them), a decimal in a string.

        Raises:
            AvroEncodeError: the datum does not fit the schema (field, value, expected type).
            RuntimeError: :meth:`resolve` was not called.
        """
        import fastavro
        from fastavro.validation import ValidationError, validate

        if self._parsed is None:
            msg = f"avro subject {self.subject!r}: resolve() the schema id first"
            raise RuntimeError(msg)
        schema = self._parsed
        if isinstance(schema, dict) and schema.get("type") == "record" and type(datum) is not dict:
            what = (
                f"the data is a {type(datum).__name__}; record {schema.get('name')} needs an object"
            )
            raise self.error(f"{what} with its fields")
        try:
            if self._converts:
                datum = _convert(datum, self._parsed, self._named, self._plans)
            validate(datum, self._parsed, raise_errors=True)
            out = io.BytesIO()
            out.write(self.header)
            fastavro.schemaless_writer(out, self._parsed, datum)
        except ValidationError as e:
            raise self.error(_reasons(e)) from None
        except RecursionError:
            raise self.error("the data nests deeper than Python can walk") from None
        except (ValueError, TypeError, OverflowError, AttributeError) as e:
            raise self.error(f"{type(e).__name__}: {e}") from None
        return out.getvalue()


def _reasons(e: Exception) -> str:
    errors = getattr(e, "errors", None) or [str(e)]
    cut = [m if len(m) <= 300 else m[:280] + " ... (cut)" for m in map(str, errors)]
    return "; ".join(cut)


def _resolve(schema: Any, named: dict[str, Any]) -> Any:
    return named.get(schema, schema) if isinstance(schema, str) else schema


def _needs_conversion(schema: Any, named: dict[str, Any], seen: set[str]) -> bool:
    """Whether a JSON datum may need converting (bytes, fixed or decimals in the schema)."""
    if isinstance(schema, str):
        if schema == "bytes":
            return True
        if schema in seen or schema not in named:
            return False
        return _needs_conversion(named[schema], named, seen)  # a record marks itself seen
    if isinstance(schema, list):
        return any(_needs_conversion(s, named, seen) for s in schema)
    kind = schema.get("type")
    if kind in ("bytes", "fixed"):
        return True
    if kind == "record":
        name = schema.get("name")
        if name in seen:
            return False
        seen.add(name)
        return any(_needs_conversion(f["type"], named, seen) for f in schema["fields"])
    if kind == "array":
        return _needs_conversion(schema["items"], named, seen)
    if kind == "map":
        return _needs_conversion(schema["values"], named, seen)
    return isinstance(kind, (dict, list, str)) and _needs_conversion(kind, named, seen)


def _convert(value: Any, schema: Any, named: dict[str, Any], plans: dict[int, Any]) -> Any:
    """A JSON datum's bytes/fixed (base64 text) and decimals (text) as Avro wants them; the
    rest as it is (validation names what still does not fit)."""
    schema = _resolve(schema, named)
    if isinstance(schema, list):  # a union: the first branch the converted value fits
        from fastavro.validation import validate

        if value is None:
            return None
        for branch in schema:
            try:
                candidate = _convert(value, branch, named, plans)
                if validate(candidate, _resolve(branch, named), raise_errors=False):
                    return candidate
            except (ValueError, TypeError):
                continue
        return value
    kind = schema if isinstance(schema, str) else schema.get("type")
    if isinstance(kind, (dict, list)):
        return _convert(value, kind, named, plans)
    if kind == "record" and isinstance(value, dict):
        todo = plans.get(id(schema))
        if todo is None:  # only the fields that may hold bytes, fixed or decimals are walked
            fields = schema["fields"]
            todo = plans[id(schema)] = [
                (f["name"], f["type"]) for f in fields if _needs_conversion(f["type"], named, set())
            ]
        if not todo:
            return value
        out = dict(value)
        for name, kind_of in todo:
            if name in out:
                out[name] = _convert(out[name], kind_of, named, plans)
        return out
    if kind == "array" and isinstance(value, list):
        return [_convert(v, schema["items"], named, plans) for v in value]
    if kind == "map" and isinstance(value, dict):
        return {k: _convert(v, schema["values"], named, plans) for k, v in value.items()}
    if kind in ("bytes", "fixed"):
        logical = schema.get("logicalType") if isinstance(schema, dict) else None
        if logical == "decimal" and isinstance(value, (str, int, float)):
            try:
                return Decimal(str(value))
            except InvalidOperation:
                return value
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                return value  # validation names it
    return value
