"""Configuration of the ``enrich`` step (``steps: [{id: ..., enrich: {...}}]``): call an HTTP
endpoint or read a Redis hash per event (or per batch), merge the answer into the event.

```yaml
- id: customer
  enrich:
    http: {url: "http://crm.internal/customers/{data.customer_id}"}
    into: data.customer
    cache: {key: data.customer_id, ttl_s: 60}
    on_failure: skip
```
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints, model_validator

from eventbus.eventing.sinks._http_config import HttpSinkAuthConfig
from eventbus.pipelines._delivery_config import BackoffConfig
from eventbus.pipelines.steps._values import CONFIG, CelSource

__all__ = [
    "EnrichCacheConfig",
    "EnrichConfig",
    "EnrichHttpConfig",
    "EnrichRedisConfig",
    "expressions",
    "url_parts",
]

#: A ``{CEL}`` placeholder of a templated URL (no nested braces).
_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")
_HEADER = r"^[A-Za-z0-9-]+$"
#: Where the answer goes: ``data`` (replaces it) or ``data.a.b``.
_INTO = r"^data(\.[A-Za-z_][A-Za-z0-9_-]*)*$"


def url_parts(url: str) -> list[tuple[bool, str]]:
    """A templated URL split into literal parts (False) and CEL expressions (True).

    Example:
        >>> url_parts("http://h/c/{data.id}?x=1")
        [(False, 'http://h/c/'), (True, 'data.id'), (False, '?x=1')]
    """
    parts: list[tuple[bool, str]] = []
    at = 0
    for m in _PLACEHOLDER.finditer(url):
        if m.start() > at:
            parts.append((False, url[at : m.start()]))
        parts.append((True, m.group(1).strip()))
        at = m.end()
    if at < len(url):
        parts.append((False, url[at:]))
    return parts


class EnrichHttpConfig(BaseModel):
    """An HTTP endpoint answering JSON; auth and TLS settings as the HTTP sink's."""

    model_config = CONFIG
    url: Annotated[str, StringConstraints(min_length=8)] = Field(
        description="The endpoint; '{CEL}' parts are filled from the event, URL-encoded "
        "(e.g. 'http://crm/customers/{data.customer_id}'). Redirects are not followed."
    )
    method: Literal["GET", "POST", "PUT", "PATCH"] = Field(
        default="GET", description="HTTP method."
    )
    body: CelSource | None = Field(
        default=None,
        description="CEL expression whose value is sent as the JSON body ('data': the event's "
        "data). Default: none for GET, 'data' for the other methods.",
    )
    headers: dict[Annotated[str, StringConstraints(pattern=_HEADER)], str] = Field(
        default_factory=dict, description="Extra request headers (not secrets: put those in auth)."
    )
    auth: HttpSinkAuthConfig | None = Field(
        default=None,
        description="Bearer token or a signature (HMAC v2, Standard Webhooks), as the HTTP "
        "sink's; secrets by reference ({secret: NAME}, {env: NAME}, {file: PATH}).",
    )
    verify_tls: bool = Field(default=True, description="Check the server's TLS certificate.")
    batch: bool = Field(
        default=False,
        description="One POST per batch of cache misses: the body is a JSON array of the "
        "events' bodies, the answer a JSON array of as many answers, in order.",
    )
    max_batch: Annotated[int, Field(ge=1, le=10_000)] = Field(
        default=100, description="Bodies per batch request at most (batch: true)."
    )

    @model_validator(mode="after")
    def _check(self) -> EnrichHttpConfig:
        literal = "".join("{" if is_cel else text for is_cel, text in url_parts(self.url))
        if not re.match(r"^https?://[^/?#\s{}]+([/?#:]|$)", literal):
            msg = (
                f"url must start with http:// or https:// and a host (placeholders only after "
                f"it); got {self.url!r}; e.g. 'http://crm/customers/{{data.id}}'"
            )
            raise ValueError(msg)
        if self.batch and self.method == "GET":
            msg = "batch: true sends a JSON array of bodies: set method: POST (or drop batch)"
            raise ValueError(msg)
        if self.batch and any(is_cel for is_cel, _ in url_parts(self.url)):
            msg = f"batch: true sends one request for many events: the url cannot take placeholders; got {self.url!r}"
            raise ValueError(msg)
        return self

    def body_source(self) -> str | None:
        """The body's CEL expression (the default: see ``body``)."""
        if self.body is not None:
            return self.body
        return None if self.method == "GET" else "data"


class EnrichRedisConfig(BaseModel):
    """A Redis hash per event (HGETALL of its key, or HGET of one field)."""

    model_config = CONFIG
    key: CelSource = Field(
        description="CEL expression giving the hash's key, e.g. \"'customer:' + data.customer_id\"."
    )
    field: Annotated[str, StringConstraints(min_length=1)] | None = Field(
        default=None,
        description="Read this one field (its value parsed as JSON where it is JSON); "
        "default: the whole hash as an object.",
    )
    url: Annotated[str, StringConstraints(pattern=r"^rediss?(\+cluster)?://")] | None = Field(
        default=None, description="The Redis to read; default: the stack's Redis."
    )
    batch: bool = Field(
        default=True, description="A batch's cache misses are read in one pipelined round trip."
    )


class EnrichCacheConfig(BaseModel):
    """A TTL cache of answers in the replica (LRU, size bounded); concurrent misses for one key
    make one call."""

    model_config = CONFIG
    key: CelSource | None = Field(
        default=None,
        description="CEL expression of the cache key; default: the request itself (URL and "
        "body, or the Redis key).",
    )
    ttl_s: Annotated[float, Field(gt=0, le=7 * 86400)] = Field(
        default=60.0, description="How long an answer is reused."
    )
    max_entries: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        default=10_000, description="Answers kept at most (least recently used evicted)."
    )


class EnrichConfig(BaseModel):
    """Call an HTTP endpoint or read a Redis hash, merge the answer into the event."""

    model_config = CONFIG
    http: EnrichHttpConfig | None = Field(default=None, description="An HTTP endpoint.")
    redis: EnrichRedisConfig | None = Field(default=None, description="A Redis hash.")
    into: Annotated[str, StringConstraints(pattern=_INTO)] = Field(
        default="data",
        description="Where the answer goes: 'data' (replaces the data) or a path 'data.a.b'.",
    )
    cache: EnrichCacheConfig | None = Field(default=None, description="Answer cache; none: off.")
    max_concurrency: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=16, description="Calls in flight at most (per replica)."
    )
    max_rate: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Calls per second at most (token bucket; None: unlimited)."
    )
    burst: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Calls the bucket allows at once (default: max(1, max_rate))."
    )
    timeout_s: Annotated[float, Field(gt=0, le=600)] = Field(
        default=5.0, description="Longest one call may take, the whole answer included."
    )
    call_retries: Annotated[int, Field(ge=0, le=10)] = Field(
        default=2,
        description="Retries of a call that timed out, could not connect or got 408/429/5xx "
        "(then on_failure applies).",
    )
    backoff: BackoffConfig = Field(
        default_factory=lambda: BackoffConfig(initial_ms=50, max_ms=1000),
        description="Delay between call retries (the project's one backoff).",
    )
    max_answer_bytes: Annotated[int, Field(ge=1, le=64 * 1024 * 1024)] = Field(
        default=1024 * 1024, description="Largest answer read; a larger one is a failure."
    )
    on_failure: Literal["fail", "skip", "default"] = Field(
        default="fail",
        description="After the retries: 'fail' (the event fails in the step and is "
        "dead-lettered with the status and reason), 'skip' (it goes on unenriched, counted) "
        "or 'default' (the 'default' value is merged instead).",
    )
    default: Any = Field(default=None, description="The value merged when on_failure is 'default'.")
    drop_on_empty: bool = Field(
        default=False,
        description="An empty answer (no body, null, {}, [], a missing hash) drops the event, "
        "counted as filtered (EventBridge Pipes); false: it is merged as it is.",
    )

    @model_validator(mode="after")
    def _check(self) -> EnrichConfig:
        if (self.http is None) == (self.redis is None):
            msg = "enrich takes exactly one target: http: {url: ...} or redis: {key: ...}"
            raise ValueError(msg)
        if self.on_failure == "default" and "default" not in self.model_fields_set:
            msg = "on_failure: default needs a 'default' value to merge (e.g. default: {})"
            raise ValueError(msg)
        if self.on_failure != "default" and "default" in self.model_fields_set:
            msg = f"'default' is used only with on_failure: default; got on_failure: {self.on_failure}"
            raise ValueError(msg)
        return self


def expressions(raw: Any) -> list[tuple[tuple[int | str, ...], str, bool]]:
    """The CEL expressions of an enrich step's raw YAML value, by their place in it."""
    out: list[tuple[tuple[int | str, ...], str, bool]] = []
    if not isinstance(raw, dict):
        return out
    http, redis, cache = raw.get("http"), raw.get("redis"), raw.get("cache")
    if isinstance(http, dict):
        if isinstance(http.get("url"), str):
            out += [(("http", "url"), s, False) for c, s in url_parts(http["url"]) if c]
        if isinstance(http.get("body"), str):
            out.append((("http", "body"), http["body"], False))
    if isinstance(redis, dict) and isinstance(redis.get("key"), str):
        out.append((("redis", "key"), redis["key"], False))
    if isinstance(cache, dict) and isinstance(cache.get("key"), str):
        out.append((("cache", "key"), cache["key"], False))
    return out
