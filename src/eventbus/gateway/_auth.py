"""Caller authentication at the gateway: which secret or token guards which route.

Each ``http``/``grpc`` source may name an HMAC-SHA256 signing secret (EventBus's HMAC v2 or
Standard Webhooks) or a bearer token (``auth:``). The signature schemes themselves live in
:mod:`eventbus.eventing._signature` and :mod:`eventbus.eventing._standard_webhooks`; this
module holds the policy:

* resolving a route's secret;
* a bearer token of another pipeline is a 403 (someone we know, asking for the wrong thing),
  found in O(1) in a dict keyed by the token's SHA-256 (:func:`index_tokens`), never by
  trying every pipeline's token;
* a wrong HMAC signature is a 401: a signature cannot say which secret made it, and trying
  every other route's secret per request would be work proportional to the pipelines on the
  gateway's only event loop;
* each valid signature is accepted once (:class:`ReplayCache`; Redis on a gateway);
* who may ask for an answer (``?wait=true``, gRPC ``Invoke``): only a ``mode: sync`` source
  (:func:`answer_sync`), so that a write-only endpoint is no read oracle.

Secrets are read from the environment or a file when a route is built and are never put in a
message or a log line; every comparison is constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from eventbus._internal import keys
from eventbus.errors import ConfigError, IngressError
from eventbus.eventing import _standard_webhooks as swh
from eventbus.eventing._kafka_client import SecretRef
from eventbus.eventing._signature import DEFAULT_TOLERANCE_S, verify_signature
from eventbus.eventing.sources._http_config import AuthConfig

__all__ = [
    "Credentials",
    "MemoryReplayCache",
    "RedisReplayCache",
    "Replay",
    "ReplayCache",
    "answer_sync",
    "authenticate",
    "index_tokens",
    "load_credentials",
    "token_digest",
]

log = logging.getLogger("eventbus.gateway")


@dataclass(frozen=True, repr=False)
class Credentials:
    """A source's resolved secret (``repr`` shows no secret).

    Attributes:
        pipeline: the pipeline the secret guards.
        kind: ``"hmac"`` (signed requests, HMAC v2), ``"standard_webhooks"`` (signed requests,
            Standard Webhooks) or ``"bearer"`` (a static token).
        secret: the signing secret (Standard Webhooks: the decoded key) or the token.
        header: the signature header (HMAC v2 only).
        tolerance_s: the replay window (signed requests only).
    """

    pipeline: str
    kind: str  # "hmac" | "standard_webhooks" | "bearer"
    secret: bytes
    header: str = "authorization"
    tolerance_s: int = DEFAULT_TOLERANCE_S

    def __repr__(self) -> str:
        return f"Credentials(pipeline={self.pipeline!r}, kind={self.kind!r}, secret=<hidden>)"


def _read_secret(
    pipeline: str,
    ref: SecretRef,
    environ: Mapping[str, str],
    secrets: Mapping[str, bytes] | None,
) -> bytes:
    if ref.secret is not None:
        value_b = (secrets or {}).get(ref.secret)
        if not value_b:
            msg = (
                f"pipeline {pipeline!r}: auth secret {ref.secret!r} is not set on the stack; "
                f"set it with `eventbus secret set {ref.secret}` (the gateway picks it up "
                "within seconds, no restart)"
            )
            raise ConfigError(msg)
        return value_b
    if ref.env is not None:
        value = environ.get(ref.env)
        if not value:
            msg = (
                f"pipeline {pipeline!r}: auth secret environment variable {ref.env} is not set in "
                "the gateway's environment; store it on the stack instead "
                f"(`eventbus secret set NAME`, then secret: {{secret: NAME}}), or export it where "
                "the gateway runs (eventbus up / eventbus gateway) and redeploy"
            )
            raise ConfigError(msg)
        return value.encode()
    assert ref.file is not None
    file = ref.file
    try:
        value = Path(file).expanduser().read_text(encoding="utf-8").strip()
    except OSError as e:
        msg = f"pipeline {pipeline!r}: auth secret file {file!r} cannot be read ({e.strerror}); create it or fix the path"
        raise ConfigError(msg) from None
    if not value:
        msg = f"pipeline {pipeline!r}: auth secret file {file!r} is empty; put the secret in it"
        raise ConfigError(msg)
    return value.encode()


def load_credentials(
    pipeline: str,
    auth: AuthConfig | None,
    environ: Mapping[str, str] | None = None,
    secrets: Mapping[str, bytes] | None = None,
) -> Credentials | None:
    """Resolve a source's ``auth:`` into its secret.

    Args:
        pipeline: the pipeline (named in messages).
        auth: the source's ``auth:`` (None: open).
        environ: where ``{env: NAME}`` secrets are read from (default ``os.environ``).
        secrets: the stack's secrets by name (``{secret: NAME}``; ``eventbus secret set``).

    Returns:
        The credentials, or None for an open source.

    Raises:
        ConfigError: the secret, environment variable or file is missing (named, the
            secret never shown).
    """
    if auth is None:
        return None
    env = os.environ if environ is None else environ
    if auth.hmac_sha256 is not None:
        h = auth.hmac_sha256
        secret = _read_secret(pipeline, h.reference(), env, secrets)
        return Credentials(pipeline, "hmac", secret, h.header.lower(), h.tolerance_s)
    if auth.standard_webhooks is not None:
        w = auth.standard_webhooks
        ref = w.reference()
        raw = _read_secret(pipeline, ref, env, secrets)
        where = f"pipeline {pipeline!r}: auth secret ({ref.describe()})"
        try:
            key = swh.decode_secret(raw.decode("utf-8", "replace"), where)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return Credentials(pipeline, "standard_webhooks", key, swh.SIGNATURE_HEADER, w.tolerance_s)
    assert auth.bearer is not None
    b = auth.bearer
    return Credentials(pipeline, "bearer", _read_secret(pipeline, b.reference(), env, secrets))


def token_digest(token: bytes) -> bytes:
    """The SHA-256 of a bearer token: the key of :func:`index_tokens`' dict."""
    return hashlib.sha256(token).digest()


def index_tokens(credentials: Iterable[Credentials]) -> dict[bytes, frozenset[str]]:
    """Which pipelines each bearer token opens, keyed by :func:`token_digest` (built once per
    route table, so that telling 403 from 401 is one dict lookup per request)."""
    owners: dict[bytes, set[str]] = {}
    for c in credentials:
        if c.kind == "bearer":
            owners.setdefault(token_digest(c.secret), set()).add(c.pipeline)
    return {k: frozenset(v) for k, v in owners.items()}


@dataclass(frozen=True)
class Replay:
    """A valid signature to accept once: its replay-cache key and how long to keep it.

    Attributes:
        key: the Redis key (:func:`eventbus._internal.keys.replay`).
        ttl_s: seconds until the signature's timestamp leaves the replay window.
    """

    key: str
    ttl_s: int


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def authenticate(
    cred: Credentials | None,
    headers: Mapping[str, str],
    body: bytes,
    token_owners: Mapping[bytes, frozenset[str]] | None = None,
    *,
    method: str = "POST",
    path: str = "/",
    query: str = "",
    now: float | None = None,
) -> Replay | None:
    """Check a request's credentials against its pipeline's.

    Work per request is the same whatever the number of pipelines: one HMAC, or one token
    comparison and one dict lookup.

    Args:
        cred: the pipeline's credentials (None: open, nothing checked).
        headers: request headers (lowercase names) or gRPC metadata.
        body: the exact request body (signed by HMAC).
        token_owners: :func:`index_tokens` of every route, to tell 403 from 401 for a bearer
            token of another pipeline.
        method: the request's method (signed by HMAC).
        path: the request's path (signed by HMAC).
        query: the request's query string without ``?`` (signed by HMAC).
        now: the current time (tests).

    Returns:
        For a valid signature, the :class:`Replay` entry to claim (the caller must refuse the
        request when it was claimed before); else None.

    Raises:
        IngressError: 401 when the credentials are missing or wrong, 403 when a bearer token
            belongs to another pipeline.
    """
    if cred is None:
        return None
    if cred.kind == "bearer":
        token = _bearer(headers)
        if token is None:
            raise IngressError(
                401,
                f"pipeline {cred.pipeline!r} needs a bearer token: send 'Authorization: Bearer <token>'",
            )
        given = token.encode("utf-8", "surrogateescape")
        if hmac.compare_digest(given, cred.secret):
            return None
        owners = (token_owners or {}).get(token_digest(given), frozenset())
        if owners - {cred.pipeline}:
            raise IngressError(
                403, f"this token is not allowed to send to pipeline {cred.pipeline!r}"
            )
        raise IngressError(401, f"the bearer token is not valid for pipeline {cred.pipeline!r}")
    t = time.time() if now is None else now
    if cred.kind == "standard_webhooks":
        return _check_webhook(cred, headers, body, t)
    value = headers.get(cred.header)
    if value is None:
        raise IngressError(
            401,
            f"pipeline {cred.pipeline!r} needs signed requests: send header {cred.header}: "
            "t=<unix seconds>,v2=<hex HMAC-SHA256 of the canonical request> "
            "(eventbus.eventing.sources.sign computes it)",
        )
    got = verify_signature(
        cred.secret,
        value,
        body,
        now=t,
        method=method,
        path=path,
        query=query,
        headers=headers,
        tolerance_s=cred.tolerance_s,
        header=cred.header,
    )
    if isinstance(got, str):
        raise IngressError(401, got)
    if got is None:
        raise IngressError(
            401,
            f"the signature in header {cred.header} does not match the request for pipeline "
            f"{cred.pipeline!r} (it covers the method, path, query, content-type, ce-* headers, "
            "timestamp and body) or was made with another secret",
        )
    ts, signature = got
    ttl_s = max(1, int(ts + cred.tolerance_s - t) + 1)
    return Replay(keys.replay(cred.pipeline, signature), ttl_s)


def _check_webhook(cred: Credentials, headers: Mapping[str, str], body: bytes, t: float) -> Replay:
    """:func:`authenticate` for a Standard Webhooks route."""
    got = swh.verify_webhook(cred.secret, headers, body, now=t, tolerance_s=cred.tolerance_s)
    if isinstance(got, str):
        raise IngressError(
            401, f"pipeline {cred.pipeline!r} needs Standard Webhooks signatures: {got}"
        )
    if got is None:
        raise IngressError(
            401,
            f"the {swh.SIGNATURE_HEADER} does not match the request for pipeline "
            f"{cred.pipeline!r} (it covers the webhook-id, webhook-timestamp and body) or was "
            "made with another secret",
        )
    ts, signature = got
    ttl_s = max(1, int(ts + cred.tolerance_s - t) + 1)
    return Replay(keys.replay(cred.pipeline, "swh:" + signature), ttl_s)


class ReplayCache(Protocol):
    """Signatures seen within their replay window."""

    async def claim(self, replay: Replay) -> bool:
        """Record ``replay``; True the first time, False when it was seen before."""


class MemoryReplayCache:
    """A :class:`ReplayCache` in this process (tests, a gateway without Redis)."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, float] = {}

    async def claim(self, replay: Replay) -> bool:
        """Record ``replay``; True the first time within its window."""
        now = self._clock()
        if len(self._seen) > 4096:
            self._seen = {k: v for k, v in self._seen.items() if v > now}
        expiry = self._seen.get(replay.key)
        if expiry is not None and expiry > now:
            return False
        self._seen[replay.key] = now + replay.ttl_s
        return True


class RedisReplayCache:
    """A :class:`ReplayCache` in Redis, shared by every gateway: one ``SET key 1 NX EX ttl``
    per signed request, on the gateway's asyncio Redis client (no thread, no extra loop).

    Args:
        redis: a ``redis.asyncio.Redis`` client.
        timeout_s: how long one check may wait for Redis (then the request is refused).
    """

    def __init__(self, redis: Any, timeout_s: float = 2.0) -> None:
        self._redis = redis
        self._timeout_s = timeout_s

    async def claim(self, replay: Replay) -> bool:
        """Record ``replay``; True the first time within its window (across gateways).

        Raises:
            Exception: Redis failed or did not answer in time (the caller refuses the request).
        """
        done = self._redis.set(replay.key, "1", nx=True, ex=replay.ttl_s)
        return bool(await asyncio.wait_for(done, self._timeout_s))


def answer_sync(pipeline: str, kind: str, mode: str, wait: bool | None) -> bool:
    """Whether to answer with the pipeline's outputs (sync) or 202 once accepted (async).

    Only a ``mode: sync`` source answers: on a ``mode: async`` source (write-only) a request
    for answers would turn the endpoint into a read oracle.

    Args:
        pipeline: the pipeline (named in the message).
        kind: ``http`` or ``grpc``.
        mode: the source's ``mode``.
        wait: the caller's ``?wait=`` (None: the source's mode); gRPC ``Invoke`` is True.

    Returns:
        True for an answer, False for a 202.

    Raises:
        IngressError: 403 when answers are asked of a ``mode: async`` source.
    """
    if wait is None:
        return mode == "sync"
    if wait and mode != "sync":
        how = "?wait=true" if kind == "http" else "Invoke"
        instead = "send without ?wait=true" if kind == "http" else "call Publish"
        msg = (
            f"pipeline {pipeline!r} answers no {how}: its {kind} source is mode: {mode} "
            f"(write-only); {instead}, or set mode: sync on the source and redeploy"
        )
        raise IngressError(403, msg)
    return wait
