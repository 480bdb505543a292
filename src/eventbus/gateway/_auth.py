"""Caller authentication at the gateway: which secret or token guards which route.

Each ``http``/``grpc`` source may name an HMAC-SHA256 signing secret or a bearer token
(``auth:``). The signature scheme itself lives in :mod:`eventbus.eventing._signature` (an HTTP
sink signs with it too); this module holds the policy: resolving a route's secret, and telling
a caller with no or wrong credentials (401) from one whose credentials belong to another
pipeline (403: someone we know, asking for the wrong thing).

Secrets are read from the environment or a file when a route is built and are never put in a
message or a log line; every comparison is constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from eventbus.errors import ConfigError, IngressError
from eventbus.eventing._signature import DEFAULT_TOLERANCE_S, check_signature
from eventbus.eventing.sources._http_config import AuthConfig

__all__ = ["Credentials", "authenticate", "load_credentials"]


@dataclass(frozen=True, repr=False)
class Credentials:
    """A source's resolved secret (``repr`` shows no secret).

    Attributes:
        pipeline: the pipeline the secret guards.
        kind: ``"hmac"`` (signed requests) or ``"bearer"`` (a static token).
        secret: the signing secret or the token.
        header: the signature header (HMAC only).
        tolerance_s: the replay window (HMAC only).
    """

    pipeline: str
    kind: str  # "hmac" | "bearer"
    secret: bytes
    header: str = "authorization"
    tolerance_s: int = DEFAULT_TOLERANCE_S

    def __repr__(self) -> str:
        return f"Credentials(pipeline={self.pipeline!r}, kind={self.kind!r}, secret=<hidden>)"


def _read_secret(
    pipeline: str, env: str | None, file: str | None, environ: Mapping[str, str]
) -> bytes:
    if env is not None:
        value = environ.get(env)
        if not value:
            msg = (
                f"pipeline {pipeline!r}: auth secret environment variable {env} is not set in "
                "the gateway's environment; export it where the gateway runs (eventbus up / "
                "eventbus gateway) and redeploy"
            )
            raise ConfigError(msg)
        return value.encode()
    assert file is not None
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
    pipeline: str, auth: AuthConfig | None, environ: Mapping[str, str] | None = None
) -> Credentials | None:
    """Resolve a source's ``auth:`` into its secret.

    Args:
        pipeline: the pipeline (named in messages).
        auth: the source's ``auth:`` (None: open).
        environ: where ``*_env`` secrets are read from (default ``os.environ``).

    Returns:
        The credentials, or None for an open source.

    Raises:
        ConfigError: the environment variable is unset or the file unreadable (named, the
            secret never shown).
    """
    if auth is None:
        return None
    env = os.environ if environ is None else environ
    if auth.hmac_sha256 is not None:
        h = auth.hmac_sha256
        secret = _read_secret(pipeline, h.secret_env, h.secret_file, env)
        return Credentials(pipeline, "hmac", secret, h.header.lower(), h.tolerance_s)
    assert auth.bearer is not None
    b = auth.bearer
    return Credentials(pipeline, "bearer", _read_secret(pipeline, b.token_env, b.token_file, env))


def _hmac_ok(cred: Credentials, value: str, body: bytes, now: float) -> bool | str:
    return check_signature(
        cred.secret, value, body, now=now, tolerance_s=cred.tolerance_s, header=cred.header
    )


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
    others: Iterable[Credentials],
    *,
    now: float | None = None,
) -> None:
    """Check a request's credentials against its pipeline's.

    Args:
        cred: the pipeline's credentials (None: open, nothing checked).
        headers: request headers (lowercase names) or gRPC metadata.
        body: the exact request body (signed by HMAC).
        others: other pipelines' credentials, to tell 403 from 401.
        now: the current time (tests).

    Raises:
        IngressError: 401 when the credentials are missing or wrong, 403 when they belong to
            another pipeline.
    """
    if cred is None:
        return
    t = time.time() if now is None else now
    if cred.kind == "bearer":
        token = _bearer(headers)
        if token is None:
            raise IngressError(
                401,
                f"pipeline {cred.pipeline!r} needs a bearer token: send 'Authorization: Bearer <token>'",
            )
        if hmac.compare_digest(token.encode(), cred.secret):
            return
        for o in others:
            if o.kind == "bearer" and hmac.compare_digest(token.encode(), o.secret):
                raise IngressError(
                    403, f"this token is not allowed to send to pipeline {cred.pipeline!r}"
                )
        raise IngressError(401, f"the bearer token is not valid for pipeline {cred.pipeline!r}")
    value = headers.get(cred.header)
    if value is None:
        raise IngressError(
            401,
            f'pipeline {cred.pipeline!r} needs signed requests: send header {cred.header}: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">',
        )
    ok = _hmac_ok(cred, value, body, t)
    if ok is True:
        return
    if isinstance(ok, str):
        raise IngressError(401, ok)
    for o in others:
        if o.kind == "hmac" and o.header == cred.header and _hmac_ok(o, value, body, t) is True:
            raise IngressError(
                403, f"this signing secret is not allowed to send to pipeline {cred.pipeline!r}"
            )
    raise IngressError(
        401,
        f"the signature in header {cred.header} does not match the body for pipeline {cred.pipeline!r}",
    )
