"""A Confluent-compatible schema registry, its state in a compacted Kafka topic (``_schemas``).

``eventbus up`` serves it from the gateway at ``/registry``; :func:`kafka_registry_app` is the
same API as a standalone ASGI app. Avro schemas are checked for compatibility by Avro's
schema-resolution rules (:func:`avro_incompatibilities`) at the subject's level (BACKWARD,
FORWARD, FULL, their ``_TRANSITIVE`` forms, or NONE).
"""

from __future__ import annotations

from eventbus.schemas._app import MAX_SCHEMA_BYTES, build_registry_app, kafka_registry_app
from eventbus.schemas._avro_compat import AvroSchema, avro_incompatibilities, parse_avro
from eventbus.schemas._errors import SchemaRegistryError
from eventbus.schemas._log import SCHEMAS_TOPIC, KafkaSchemaLog, MemorySchemaLog
from eventbus.schemas._registry import SchemaLog, SchemaRegistry
from eventbus.schemas._state import DEFAULT_LEVEL, LEVELS

__all__ = [
    "AvroSchema",
    "DEFAULT_LEVEL",
    "KafkaSchemaLog",
    "LEVELS",
    "MAX_SCHEMA_BYTES",
    "MemorySchemaLog",
    "SCHEMAS_TOPIC",
    "SchemaLog",
    "SchemaRegistry",
    "SchemaRegistryError",
    "avro_incompatibilities",
    "build_registry_app",
    "kafka_registry_app",
    "parse_avro",
]
