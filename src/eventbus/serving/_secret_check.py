"""``deploy`` refuses a pipeline whose secret references do not resolve where they are used,
naming each one (instead of a gateway that answers 503 to every request later).

Where each reference is used, and how it is checked here (the controller, with the stack's
Redis):

- an ``http``/``grpc`` source's ``auth`` (the gateways): ``{secret: NAME}`` must be stored
  on the stack; ``{env: NAME}`` must be set in every live gateway's environment (each gateway
  publishes the SHA-256 of its variables' names, ``keys.GATEWAY_ENV``; with no live gateway
  nothing can be checked and nothing is refused); ``{file: PATH}`` is the gateway host's and
  is not checked.
- a sink's or a Kafka client's reference (the replicas): ``{secret: NAME}`` must be stored on
  the stack (``{env}``/``{file}`` are checked by ``eventbus validate`` where it runs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from eventbus._internal import keys
from eventbus._internal.secret_store import env_digest
from eventbus.eventing._kafka_client import SecretRef
from eventbus.pipelines._config import PipelineConfig

__all__ = ["GATEWAY_LIVE_S", "deprecated_spellings", "secret_reference_problems"]

#: A gateway's environment entry older than this is a stopped gateway's.
GATEWAY_LIVE_S = 30.0


def _gateway_refs(config: PipelineConfig) -> Iterator[tuple[str, SecretRef]]:
    for i, src in enumerate(config.spec.sources):
        for kind in ("http", "grpc"):
            ingress = getattr(src, kind, None)
            auth = getattr(ingress, "auth", None) if ingress is not None else None
            if auth is None:
                continue
            if auth.hmac_sha256 is not None:
                where = f"spec.sources[{i}].{kind}.auth.hmac_sha256.secret"
                yield where, auth.hmac_sha256.reference()
            if auth.standard_webhooks is not None:
                where = f"spec.sources[{i}].{kind}.auth.standard_webhooks.secret"
                yield where, auth.standard_webhooks.reference()
            if auth.bearer is not None:
                yield f"spec.sources[{i}].{kind}.auth.bearer.token", auth.bearer.reference()


def deprecated_spellings(config: PipelineConfig) -> list[str]:
    """A notice per secret reference spelled the old way (``secret_env: NAME`` on a source's
    auth), naming its path and the new spelling; it keeps working."""
    lines = []
    for i, src in enumerate(config.spec.sources):
        for kind in ("http", "grpc"):
            ingress = getattr(src, kind, None)
            auth = getattr(ingress, "auth", None) if ingress is not None else None
            for name in ("hmac_sha256", "standard_webhooks", "bearer"):
                part = getattr(auth, name, None) if auth is not None else None
                notice = part.deprecation() if part is not None else None
                if notice:
                    lines.append(f"spec.sources[{i}].{kind}.auth.{name}: {notice}")
    return lines


def _stored_refs(value: Any, where: str) -> Iterator[tuple[str, SecretRef]]:
    """Every :class:`SecretRef` inside a config model (sinks, Kafka clients), by its path."""
    if isinstance(value, SecretRef):
        yield where, value
    elif hasattr(value, "__pydantic_fields__"):
        for name in type(value).__pydantic_fields__:
            yield from _stored_refs(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, (list, tuple)):
        for k, v in enumerate(value):
            yield from _stored_refs(v, f"{where}[{k}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _stored_refs(v, f"{where}.{k}")


def secret_reference_problems(
    config: PipelineConfig, redis: Any, filename: str, now: float | None = None
) -> list[str]:
    """One line per secret reference that will not resolve where it is used.

    Args:
        config: the pipeline.
        redis: a synchronous client of the stack's Redis (``decode_responses=True``).
        filename: named in the lines.
        now: the current time (tests).
    """
    now = time.time() if now is None else now
    stored = set(redis.hkeys(keys.SECRETS))
    gateways = []
    for gw, raw in redis.hgetall(keys.GATEWAY_ENV).items():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if now - float(entry.get("at", 0)) <= GATEWAY_LIVE_S:
            gateways.append((gw, set(entry.get("env", []))))
    lines = []

    def missing_secret(where: str, ref: SecretRef) -> None:
        lines.append(
            f"{filename}: {where}: secret {ref.secret!r} is not set on the stack; set it with "
            f"`eventbus secret set {ref.secret}` (value on stdin), then deploy again"
        )

    for where, ref in _gateway_refs(config):
        if ref.secret is not None and ref.secret not in stored:
            missing_secret(where, ref)
        elif ref.env is not None and gateways:
            lacking = [gw for gw, env in gateways if env_digest(ref.env) not in env]
            if lacking:
                lines.append(
                    f"{filename}: {where}: environment variable {ref.env} is not set where the "
                    f"gateway runs ({len(lacking)} of {len(gateways)} live gateways lack it), so "
                    "every request would be answered 503; store it on the stack instead "
                    f"(`eventbus secret set {ref.env}`, then {{secret: {ref.env}}}: no restart), "
                    "or export it and restart the gateway"
                )
    spec = config.spec
    for i, src in enumerate(spec.sources):
        if src.kafka is not None:
            for where, ref in _stored_refs(src.kafka, f"spec.sources[{i}].kafka"):
                if ref.secret is not None and ref.secret not in stored:
                    missing_secret(where, ref)
    for k, step in enumerate(spec.steps):  # an enrich step's endpoint auth
        for where, ref in _stored_refs(step.options, f"spec.steps[{k}].{step.kind}"):
            if ref.secret is not None and ref.secret not in stored:
                missing_secret(where, ref)
    for name, sink in spec.output_paths().items():
        for where, ref in _stored_refs(sink, f"spec.{name}"):
            if ref.secret is not None and ref.secret not in stored:
                missing_secret(where, ref)
    return lines
