"""The Kafka sink's value format fields: ``value_format: avro`` or ``json_schema`` with a
registry subject.

.. code-block:: yaml

    sink:
      kafka:
        topic: payments-large
        value_format: avro
        schema_registry_url: http://127.0.0.1:8080/registry
        subject: payments-large-value
        value_schema: {type: record, name: Large, fields: [{name: amount, type: long}]}

``value_schema`` (inline) or ``value_schema_file`` is registered under ``subject`` at deploy
(checked against the subject's compatibility level first); ``version`` pins an existing
version instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationInfo,
    model_validator,
)

from eventbus.eventing._confluent_avro import SchemaRegistryUrl

__all__ = ["AvroValueConfig", "avro_encoder"]

#: Largest schema file read (the registry refuses larger schemas too).
_MAX_SCHEMA_FILE = 10 * 1024 * 1024


class AvroValueConfig(BaseModel):
    """The value format of a Kafka sink (a base of ``KafkaSinkConfig``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value_format: Literal["json", "avro", "json_schema"] = Field(
        default="json",
        description="'json': the event's data as JSON (CloudEvents binary or structured "
        "mode). 'avro': the data as Avro in the Confluent wire format (magic byte 0, the "
        "4-byte schema id, the Avro body) under 'subject' of 'schema_registry_url'. "
        "'json_schema': the same header and the data as JSON, validated against the "
        "subject's JSON Schema first. Data that does not fit the schema is dead-lettered "
        "with the reason.",
    )
    schema_registry_url: SchemaRegistryUrl = None
    subject: str | None = Field(
        default=None,
        min_length=1,
        description="The registry subject of value_format avro or json_schema, e.g. '<topic>-value' (the "
        "Confluent serializers' default naming).",
    )
    value_schema: dict[str, Any] | list[Any] | str | None = Field(
        default=None,
        description="The schema of value_format avro (Avro) or json_schema (a JSON Schema), "
        "inline (a YAML mapping or JSON text); registered under 'subject' at deploy when missing, after a compatibility "
        "check against the subject's level.",
    )
    value_schema_file: str | None = Field(
        default=None,
        description="A file holding the schema (.avsc or .json), relative to the pipeline "
        "file's directory; read when the pipeline is loaded and carried inline from then on.",
    )
    version: PositiveInt | Literal["latest"] | None = Field(
        default=None,
        description="A version of 'subject' to write with (instead of value_schema): the "
        "schema must exist in the registry at deploy.",
    )

    @model_validator(mode="before")
    @classmethod
    def _read_schema_file(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or data.get("value_schema_file") is None:
            return data
        data = dict(data)
        name = data.pop("value_schema_file")
        if data.get("value_schema") is not None:
            msg = "give value_schema or value_schema_file, not both"
            raise ValueError(msg)
        base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
        path = Path(base or ".") / str(name)  # an absolute name stays itself
        try:
            if path.stat().st_size > _MAX_SCHEMA_FILE:
                msg = f"value_schema_file {name!r} is over {_MAX_SCHEMA_FILE} bytes"
                raise ValueError(msg)
            data["value_schema"] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            msg = (
                f"value_schema_file {name!r} cannot be read ({type(e).__name__}: {e}); "
                f"relative paths are read from the pipeline file's directory "
                f"({str(Path(base or '.').resolve())!r})"
            )
            raise ValueError(msg) from None
        return data

    @model_validator(mode="after")
    def _avro_complete(self) -> AvroValueConfig:
        given = [
            n
            for n in ("schema_registry_url", "subject", "value_schema", "version")
            if getattr(self, n) is not None
        ]
        if self.value_format == "json":
            if given:
                msg = (
                    f"{', '.join(given)} only apply to value_format 'avro' or 'json_schema'; "
                    "set value_format or remove them"
                )
                raise ValueError(msg)
            return self
        fmt = self.value_format
        if getattr(self, "mode", "binary") == "structured":
            msg = (
                f"value_format {fmt!r} writes the data as the record value (binary mode); "
                "remove 'mode: structured'"
            )
            raise ValueError(msg)
        if not self.schema_registry_url:
            msg = (
                f"value_format is {fmt!r} but schema_registry_url is not set; set it to the "
                "registry (EventBus's own: `eventbus url registry`)"
            )
            raise ValueError(msg)
        if not self.subject:
            msg = f"value_format is {fmt!r} but subject is not set; set it, e.g. '<topic>-value'"
            raise ValueError(msg)
        if (self.value_schema is None) == (self.version is None):
            msg = (
                f"value_format {fmt!r} needs value_schema (or value_schema_file) to register, "
                "or version to pin an existing one; give exactly one"
            )
            raise ValueError(msg)
        if self.value_schema is not None and fmt == "json_schema":
            from eventbus.eventing._confluent_json import json_schema_validator

            try:
                json_schema_validator(self.value_schema)
            except ValueError as e:
                msg = f"value_schema: {e}; give a JSON Schema (an object, e.g. type: object)"
                raise ValueError(msg) from None
        elif self.value_schema is not None:
            from eventbus.eventing._avro_encode import parse_avro_schema

            try:
                parse_avro_schema(self.value_schema)
            except ValueError as e:
                msg = f"value_schema: {e}; give an Avro schema (a record, with name and fields)"
                raise ValueError(msg) from None
        return self


def avro_encoder(config: AvroValueConfig) -> Any:
    """The encoder of a sink config with ``value_format: avro`` (an
    :class:`~eventbus.eventing._avro_encode.AvroWireEncoder`) or ``json_schema`` (a
    :class:`~eventbus.eventing._confluent_json.JsonSchemaWireEncoder`); None for json."""
    if config.value_format == "json":
        return None
    from eventbus.eventing._avro_encode import AvroWireEncoder
    from eventbus.eventing._confluent_json import JsonSchemaWireEncoder

    assert config.schema_registry_url is not None and config.subject is not None
    kind = JsonSchemaWireEncoder if config.value_format == "json_schema" else AvroWireEncoder
    return kind(
        config.schema_registry_url,
        config.subject,
        schema=config.value_schema,
        version=config.version,
    )
