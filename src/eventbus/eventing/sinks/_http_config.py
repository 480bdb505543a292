"""Configuration of the HTTP sink (``sink: {http: {url: ...}}``): a subscriber URL."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from eventbus.eventing._kafka_client import SecretRef
from eventbus.eventing._signature import SIGNATURE_HEADER

__all__ = [
    "HttpSinkAuthConfig",
    "HttpSinkBearerConfig",
    "HttpSinkConfig",
    "HttpSinkHmacConfig",
    "HttpSinkStandardWebhooksConfig",
]

_MODEL = ConfigDict(extra="forbid", frozen=True)
_HEADER = r"^[A-Za-z0-9-]+$"


class HttpSinkBearerConfig(BaseModel):
    """``Authorization: Bearer <token>`` on every request."""

    model_config = _MODEL
    token: SecretRef = Field(
        description="The token, by reference: {secret: NAME} (stored on the stack, re-read "
        "within seconds of a rotation), {env: NAME} or {file: PATH}."
    )


class HttpSinkHmacConfig(BaseModel):
    """Requests signed as the gateway verifies them (``t=<unix s>,v2=<HMAC-SHA256>`` of the
    canonical request: :func:`eventbus.eventing.sources.sign_request`)."""

    model_config = _MODEL
    secret: SecretRef = Field(
        description="The shared secret, by reference: {secret: NAME} (stored on the stack, "
        "re-read within seconds of a rotation), {env: NAME} or {file: PATH}."
    )
    header: Annotated[str, StringConstraints(pattern=_HEADER)] = Field(
        default=SIGNATURE_HEADER, description="The header carrying the signature."
    )


class HttpSinkStandardWebhooksConfig(BaseModel):
    """Requests signed with Standard Webhooks (standardwebhooks.com): ``webhook-id`` (the same
    on every retry of a request: derived from its events' ``source`` and ``id``),
    ``webhook-timestamp`` and ``webhook-signature: v1,<base64 HMAC-SHA256>``, as a receiver's
    Standard Webhooks library verifies them."""

    model_config = _MODEL
    secret: SecretRef = Field(
        description="The shared secret (whsec_<base64 key>), by reference: {env: ...}/{file: ...}."
    )


class HttpSinkAuthConfig(BaseModel):
    """How requests authenticate to the subscriber: exactly one of ``bearer``,
    ``hmac_sha256`` or ``standard_webhooks``."""

    model_config = _MODEL
    bearer: HttpSinkBearerConfig | None = Field(default=None, description="A bearer token.")
    hmac_sha256: HttpSinkHmacConfig | None = Field(
        default=None, description="Signed requests, EventBus's HMAC v2 scheme."
    )
    standard_webhooks: HttpSinkStandardWebhooksConfig | None = Field(
        default=None, description="Signed requests, the Standard Webhooks scheme."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> HttpSinkAuthConfig:
        given = (self.bearer, self.hmac_sha256, self.standard_webhooks)
        if sum(x is not None for x in given) != 1:
            msg = "http sink auth takes exactly one of bearer, hmac_sha256 or standard_webhooks"
            raise ValueError(msg)
        return self


class HttpSinkConfig(BaseModel):
    """Configuration of an HTTP sink: events POSTed to a subscriber, CloudEvents HTTP binding.

    Example:
        >>> HttpSinkConfig(url="https://hooks.example.com/orders", max_rate=200).mode
        'binary'
    """

    model_config = _MODEL

    url: Annotated[str, StringConstraints(pattern=r"^https?://[^/?#\s]+[^\s]*$")] = Field(
        description="The subscriber's URL (http:// or https://); redirects are not followed."
    )
    mode: Literal["binary", "structured", "batch"] = Field(
        default="binary",
        description="CloudEvents HTTP content mode: 'binary' (attributes in ce- headers, data "
        "as the body), 'structured' (one JSON event per request) or 'batch' (a JSON array of "
        "up to max_batch events per request, acknowledged or refused together).",
    )
    max_batch: Annotated[int, Field(ge=1, le=10_000)] = Field(
        default=100, description="Events per request in batch mode."
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="Extra request headers (not secrets: put those in auth).",
    )
    auth: HttpSinkAuthConfig | None = Field(
        default=None,
        description="Bearer token or a signature (HMAC v2, Standard Webhooks); None: none.",
    )
    timeout_s: Annotated[float, Field(gt=0, le=600)] = Field(
        default=10.0,
        description="Longest one request may take, connecting and the whole answer included; "
        "then it is retried.",
    )
    max_concurrency: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=16,
        description="Requests in flight at most (also the connection pool's size). Events "
        "with the same key (partitionkey, else the input record's key) go one after another, "
        "in order.",
    )
    max_rate: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Events per second at most (None: unlimited)."
    )
    max_retry_after_s: Annotated[float, Field(ge=0, le=3600)] = Field(
        default=60.0, description="Cap on a subscriber's Retry-After."
    )
    verify_tls: bool = Field(default=True, description="Check the server's TLS certificate.")
    reply: bool = Field(
        default=False,
        description="A 2xx answer that is a CloudEvent (binary ce- headers or structured "
        "application/cloudevents+json) continues to the next sink of the route, as a Knative "
        "reply; an answer without one ends there. Binary or structured mode only.",
    )
    max_reply_bytes: Annotated[int, Field(ge=1, le=64 * 1024 * 1024)] = Field(
        default=1024 * 1024,
        description="Largest reply read (with reply: true); a larger one dead-letters the "
        "event's input with the reason.",
    )

    @model_validator(mode="after")
    def _reply_mode(self) -> HttpSinkConfig:
        if self.reply and self.mode == "batch":
            msg = (
                "reply: true takes one event per request (mode binary or structured); got mode "
                "'batch'; set mode: binary, or drop reply"
            )
            raise ValueError(msg)
        return self
