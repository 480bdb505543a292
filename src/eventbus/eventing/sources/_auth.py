"""Caller authentication of the gateway's sources: HMAC-SHA256 signatures and bearer tokens.

Secrets are read from the environment or a file when a route is built and are never put in a
message or a log line; every comparison is constant time (``hmac.compare_digest``).

A caller with no or wrong credentials gets 401; a caller whose credentials are valid for
another pipeline gets 403 (it is someone we know, asking for the wrong thing).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from eventbus.errors import ConfigError, IngressError
from eventbus.eventing.sources._http_config import AuthConfig

__all__ = ["Credentials", "authenticate", "load_credentials", "sign"]


@dataclass(frozen=True, repr=False)
class Credentials:
    """A source's resolved secret (``repr`` shows no secret)."""

    pipeline: str
    kind: str  # "hmac" | "bearer"
    secret: bytes
    header: str = "authorization"
    tolerance_s: int = 300

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


def sign(secret: bytes | str, body: bytes, timestamp: int | None = None) -> str:
    """The signature header value for ``body``: ``t=<unix seconds>,v1=<hex HMAC-SHA256>``.

    Example:
        >>> sign(b"s3cret", b"{}", timestamp=1700000000)[:15]
        't=1700000000,v1'
    """
    key = secret.encode() if isinstance(secret, str) else secret
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(key, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def _hmac_ok(cred: Credentials, value: str, body: bytes, now: float) -> bool | str:
    """True when valid; a reason string when malformed or outside the window; False when the
    signature does not match."""
    t: str | None = None
    sigs: list[str] = []
    for part in value.split(","):
        k, _, v = part.strip().partition("=")
        if k == "t":
            t = v
        elif k == "v1":
            sigs.append(v)
    if t is None or not t.isdigit() or not sigs:
        return f"header {cred.header} must be 't=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">'"
    if abs(now - int(t)) > cred.tolerance_s:
        return f"the signature's timestamp is outside the {cred.tolerance_s} s replay window; sign the request again with the current time"
    expected = hmac.new(cred.secret, t.encode() + b"." + body, hashlib.sha256).hexdigest()
    ok = False
    for s in sigs:
        ok |= hmac.compare_digest(expected, s)
    return ok


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
