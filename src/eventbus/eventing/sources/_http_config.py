"""Configuration of the HTTP and gRPC sources (``sources: [{http: {...}}]``, ``[{grpc: {...}}]``).

Both are served by the gateway (``eventbus gateway``, started by ``eventbus up``). An accepted
event is written to the pipeline's ingress topic (``eventbus-ingress-<pipeline>``) before the
caller gets its 202, and the pipeline's replicas consume that topic like any Kafka source.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from eventbus.eventing._kafka_client import SecretRef
from eventbus.eventing._signature import DEFAULT_TOLERANCE_S, SIGNATURE_HEADER
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.registry import sources

__all__ = [
    "GATEWAY_PRODUCERS",
    "AuthConfig",
    "BearerAuthConfig",
    "GrpcSourceConfig",
    "HmacAuthConfig",
    "HttpSourceConfig",
    "StandardWebhooksAuthConfig",
    "ingress_topic",
]

_MODEL = ConfigDict(extra="forbid", frozen=True)
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"

#: Kafka producers per pipeline in each gateway. The controller creates ingress topics with at
#: least as many partitions, so that each producer writes partitions of its own (measured:
#: 4 -> 8 gave ~+5-15% async req/s at -c16).
GATEWAY_PRODUCERS = 8


def ingress_topic(pipeline: str) -> str:
    """The topic the gateway writes a pipeline's accepted HTTP and gRPC events to."""
    return f"eventbus-ingress-{pipeline}"


class _SecretRef(BaseModel):
    model_config = _MODEL

    @model_validator(mode="after")
    def _one_place(self) -> Any:
        ref, env, file = self._refs()
        new = self._names()[0]
        if sum(x is not None for x in (ref, env, file)) != 1:
            msg = (
                f"give exactly one {new}: {{secret: NAME}} (stored with `eventbus secret set`), "
                f"{{env: NAME}} or {{file: PATH}}"
            )
            raise ValueError(msg)
        return self

    def deprecation(self) -> str | None:
        """The notice for the old spelling (``secret_env: NAME``...), None for the new one."""
        _, env, file = self._refs()
        if env is None and file is None:
            return None
        new, old_env, old_file = self._names()
        old, spelled = (old_env, f"{{env: {env}}}") if env else (old_file, f"{{file: {file}}}")
        return (
            f"{old} is deprecated; write {new}: {spelled} (or {new}: {{secret: NAME}} for a "
            "secret stored with `eventbus secret set`)"
        )

    def reference(self) -> SecretRef:
        """The secret's reference, whichever way it was spelled."""
        ref, env, file = self._refs()
        if ref is not None:
            return ref
        return SecretRef(env=env) if env is not None else SecretRef(file=file)

    def _refs(self) -> tuple[SecretRef | None, str | None, str | None]:
        raise NotImplementedError

    def _names(self) -> tuple[str, str, str]:
        raise NotImplementedError


class _SigningSecret(_SecretRef):
    """A signature scheme's secret (one reference, or the deprecated spellings) and its replay
    window: what ``hmac_sha256`` and ``standard_webhooks`` share."""

    secret: SecretRef | None = Field(
        default=None,
        description="The signing secret, by reference: {secret: NAME} (stored on the stack), "
        "{env: NAME} (of the gateway) or {file: PATH}.",
    )
    secret_env: Annotated[str, StringConstraints(pattern=_ENV_NAME)] | None = Field(
        default=None, description="Deprecated: write secret: {env: NAME}."
    )
    secret_file: str | None = Field(
        default=None, description="Deprecated: write secret: {file: PATH}."
    )
    tolerance_s: int = Field(
        default=DEFAULT_TOLERANCE_S, ge=1, le=86_400, description="Replay window in seconds."
    )

    def _refs(self) -> tuple[SecretRef | None, str | None, str | None]:
        return self.secret, self.secret_env, self.secret_file

    def _names(self) -> tuple[str, str, str]:
        return "secret", "secret_env", "secret_file"


class HmacAuthConfig(_SigningSecret):
    """HMAC-SHA256 signatures of the whole request (Stripe's header, a canonical request).

    The sender puts ``t=<unix seconds>,v2=<hex HMAC-SHA256 of the canonical request>`` in the
    signature header (the canonical form: :mod:`eventbus.eventing._signature`; ``sign()``
    computes it); requests older or newer than ``tolerance_s`` are refused (replay window)
    and each signature is accepted once.
    """

    header: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9-]+$")] = Field(
        default=SIGNATURE_HEADER, description="Header carrying 't=...,v2=...'."
    )


class StandardWebhooksAuthConfig(_SigningSecret):
    """Standard Webhooks signatures (standardwebhooks.com): ``webhook-id``,
    ``webhook-timestamp`` and ``webhook-signature: v1,<base64 HMAC-SHA256 of
    '<id>.<timestamp>.<body>'>``, as every language's Standard Webhooks library sends them.

    The secret is ``whsec_<base64 key>``; requests older or newer than ``tolerance_s`` are
    refused (replay window) and each signature is accepted once. The signature covers the id,
    the time and the body only (``hmac_sha256`` also covers the method, path, query and
    ``ce-*`` headers).
    """


class BearerAuthConfig(_SecretRef):
    """A static bearer token (``Authorization: Bearer <token>``)."""

    token: SecretRef | None = Field(
        default=None,
        description="The token, by reference: {secret: NAME} (stored on the stack), "
        "{env: NAME} (of the gateway) or {file: PATH}.",
    )
    token_env: Annotated[str, StringConstraints(pattern=_ENV_NAME)] | None = Field(
        default=None, description="Deprecated: write token: {env: NAME}."
    )
    token_file: str | None = Field(
        default=None, description="Deprecated: write token: {file: PATH}."
    )

    def _refs(self) -> tuple[SecretRef | None, str | None, str | None]:
        return self.token, self.token_env, self.token_file

    def _names(self) -> tuple[str, str, str]:
        return "token", "token_env", "token_file"


class AuthConfig(BaseModel):
    """How callers authenticate: exactly one of ``hmac_sha256``, ``standard_webhooks`` or
    ``bearer``."""

    model_config = _MODEL
    hmac_sha256: HmacAuthConfig | None = Field(
        default=None, description="Signed requests, EventBus's HMAC v2 scheme (HTTP only)."
    )
    standard_webhooks: StandardWebhooksAuthConfig | None = Field(
        default=None, description="Signed requests, the Standard Webhooks scheme (HTTP only)."
    )
    bearer: BearerAuthConfig | None = Field(
        default=None, description="A bearer token (HTTP and gRPC)."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> AuthConfig:
        given = (self.hmac_sha256, self.standard_webhooks, self.bearer)
        if sum(x is not None for x in given) != 1:
            msg = "auth takes exactly one of hmac_sha256, standard_webhooks or bearer"
            raise ValueError(msg)
        return self


class _IngressSourceConfig(BaseModel):
    model_config = _MODEL
    type: str = Field(
        default="eventbus.http",
        min_length=1,
        description="CloudEvents 'type' given to plain JSON bodies.",
    )
    source: str | None = Field(
        default=None,
        description="CloudEvents 'source' given to plain JSON bodies; None uses '/eventbus/{pipeline}'.",
    )
    mode: Literal["async", "sync"] = Field(
        default="async",
        description="async: answer 202 once the event is durably accepted (write-only: "
        "?wait=true and gRPC Invoke are refused with 403); sync: answer with the pipeline's "
        "outputs (callers may ask for a 202 instead with ?wait=false).",
    )
    auth: AuthConfig | None = Field(
        default=None, description="Caller authentication; None accepts anyone."
    )
    data_schema: dict[str, Any] | None = Field(
        default=None,
        description="A JSON Schema (draft 2020-12) every event's data must satisfy (422 otherwise).",
    )
    max_body_bytes: int = Field(
        default=1_048_576,
        ge=1,
        le=64 * 1_048_576,
        description="Largest accepted request body (413 above).",
    )
    timeout_ms: int = Field(
        default=10_000, ge=1, le=600_000, description="Deadline of a sync request (504 after)."
    )

    @field_validator("data_schema")
    @classmethod
    def _schema_valid(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as e:
            where = "/".join(str(p) for p in e.path) or "(root)"
            msg = f"data_schema is not a valid JSON Schema (draft 2020-12) at {where}: {e.message}"
            raise ValueError(msg) from None
        from eventbus.eventing.sources._data_schema import check_data_schema

        check_data_schema(value)  # its regexes run with RE2: one it cannot compile is named
        return value


class HttpSourceConfig(_IngressSourceConfig):
    """Events from HTTP requests to the gateway (``POST /v1/pipelines/{name}/events``, and
    ``path`` when given)."""

    path: Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9_.~/-]*$")] | None = Field(
        default=None,
        description="An extra path the gateway serves for this pipeline, e.g. /payments (not "
        "under /v1/ and not /metrics, /healthz or /openapi.json).",
    )

    @field_validator("path")
    @classmethod
    def _path_free(cls, value: str | None) -> str | None:
        if value is None:
            return None
        reserved = ("/v1", "/metrics", "/healthz", "/openapi.json", "/docs", "/redoc")
        for r in reserved:
            if value == r or value.startswith(r + "/"):
                msg = f"path {value!r} is reserved by the gateway ({r}); choose another, e.g. /hooks{value}"
                raise ValueError(msg)
        if value == "/":
            msg = "path '/' would shadow the gateway; choose a path such as /payments"
            raise ValueError(msg)
        return value.rstrip("/")


class GrpcSourceConfig(_IngressSourceConfig):
    """Events from gRPC calls to the gateway's ``eventbus.v1.EventBus`` service
    (``Publish``/``Invoke``, pipeline named in the ``x-eventbus-pipeline`` metadata)."""

    type: str = Field(
        default="eventbus.grpc",
        min_length=1,
        description="Unused by gRPC (events arrive as CloudEvents).",
    )

    @model_validator(mode="after")
    def _no_hmac(self) -> GrpcSourceConfig:
        if self.auth is not None and self.auth.bearer is None:
            msg = "grpc sources authenticate with bearer tokens only; use auth: {bearer: {token: {secret: NAME}}} (or {env: NAME})"
            raise ValueError(msg)
        return self


# -- the http and grpc source kinds: the gateway writes their events to the ingress topic -----


def _unique_paths(configs: list[HttpSourceConfig]) -> None:
    paths: set[str | None] = set()
    for c in configs:
        if c.path in paths:
            shown = c.path or "(no path)"
            msg = f"two http sources share path {shown}; give each http source its own path"
            raise ValueError(msg)
        paths.add(c.path)


def _one_grpc(configs: list[GrpcSourceConfig]) -> None:
    if len(configs) > 1:
        msg = "a pipeline takes at most one grpc source (gRPC calls name the pipeline, not a path)"
        raise ValueError(msg)


@sources.register(
    "http",
    config=HttpSourceConfig,
    description="Accept events over HTTP at the gateway.",
    ingress=True,
    check_all=_unique_paths,
    describe=lambda raw: raw.get("path") or "",
)
def http_source(config: HttpSourceConfig, pipeline: str) -> KafkaSourceConfig:
    """The gateway writes HTTP events to the pipeline's ingress topic."""
    return KafkaSourceConfig(topic=ingress_topic(pipeline))


@sources.register(
    "grpc",
    config=GrpcSourceConfig,
    description="Accept events over gRPC at the gateway.",
    ingress=True,
    check_all=_one_grpc,
    describe=lambda raw: "",
)
def grpc_source(config: GrpcSourceConfig, pipeline: str) -> KafkaSourceConfig:
    """The gateway writes gRPC events to the pipeline's ingress topic."""
    return KafkaSourceConfig(topic=ingress_topic(pipeline))
