"""A pipeline's registry sinks, checked against their subjects at deploy.

For each Kafka output with ``value_format: avro`` or ``json_schema``: an inline schema is checked against the
subject's compatibility level (``POST /compatibility/subjects/{s}/versions/latest``) and
registered; a pinned ``version`` must exist. A refusal names the YAML path, the subject and
the registry's reasons, and nothing is deployed.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from eventbus.errors import DeployError, EventBusError
from eventbus.eventing._confluent_avro import RegistryClient
from eventbus.eventing._registry_subject import SinkSchemaError
from eventbus.eventing.sinks._kafka_avro_config import avro_encoder
from eventbus.pipelines._config import PipelineConfig

__all__ = ["check_sink_schemas", "sink_schema_problems"]


def _incompatibilities(sink: Any) -> list[str]:
    """The registry's reasons the inline schema is incompatible with the subject (empty:
    compatible, or the subject has no version yet)."""
    http = RegistryClient(sink.schema_registry_url)
    text = (
        sink.value_schema if isinstance(sink.value_schema, str) else json.dumps(sink.value_schema)
    )
    path = f"/compatibility/subjects/{quote(sink.subject, safe='')}/versions/latest?verbose=true"
    body = {"schema": text}
    if sink.value_format == "json_schema":
        body["schemaType"] = "JSON"
    response = http.request_sync("POST", path, body)
    if response.status_code == 404:  # a new subject: anything may be its first version
        return []
    body = response.json() if response.status_code in (200, 422) else {}
    if response.status_code == 200 and body.get("is_compatible"):
        return []
    if response.status_code == 200:
        return [str(m) for m in body.get("messages") or ["incompatible"]]
    return [f"{response.status_code} {str(body.get('message', response.text))[:300]}"]


def sink_schema_problems(config: PipelineConfig) -> list[str]:
    """One line per Avro or JSON Schema output whose schema or version the registry refuses; the inline
    schemas that pass are registered (idempotent: the same schema keeps its id)."""
    problems: list[str] = []
    for path, sink in config.spec.output_paths().items():
        options = sink.kafka
        if options is None or options.value_format == "json":
            continue
        at = f"spec.{path}.kafka"
        try:
            if options.value_schema is not None:
                reasons = _incompatibilities(options)
                if reasons:
                    level = (
                        f"`eventbus registry get {options.subject}` shows its versions; make "
                        "the change compatible with the subject's level or change the level"
                    )
                    problems.append(
                        f"{at}.value_schema: incompatible with subject {options.subject!r} at "
                        f"{options.schema_registry_url}: {'; '.join(reasons)}; {level}"
                    )
                    continue
            encoder = avro_encoder(options)
            encoder.resolve_sync()  # registers the inline schema; a pinned version must exist
        except SinkSchemaError as e:
            field = "version" if options.version is not None else "value_schema"
            problems.append(f"{at}.{field}: {e}")
        except EventBusError as e:  # the registry cannot be reached, or wants credentials
            fix = (
                "register the schema first (`eventbus registry register "
                f"{options.subject} FILE` takes the admin token) and pin 'version'"
                if " answered 401 " in str(e) or " answered 403 " in str(e)
                else "start the registry or fix the URL"
            )
            problems.append(f"{at}.schema_registry_url: {e}; {fix}")
    return problems


def check_sink_schemas(config: PipelineConfig) -> None:
    """Refuse the deploy when an Avro or JSON Schema output's schema does not fit its subject.

    Raises:
        DeployError: naming every refused output (YAML path, subject, the registry's reason).
    """
    problems = sink_schema_problems(config)
    if problems:
        msg = f"pipeline {config.name!r} could not be deployed:\n" + "\n".join(problems)
        raise DeployError(msg)
