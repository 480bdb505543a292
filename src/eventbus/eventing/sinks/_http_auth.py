"""How an HTTP sender authenticates (the HTTP sink, an ``enrich`` step's endpoint): the auth
settings resolved into :class:`HttpAuth` (the secret's value, never logged), the headers it
adds to a request, and the connection pool both open."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eventbus.errors import ConfigError
from eventbus.eventing._signature import sign_request
from eventbus.eventing._standard_webhooks import decode_secret, webhook_headers
from eventbus.eventing.sinks._http_config import HttpSinkAuthConfig

__all__ = ["HttpAuth", "open_client", "resolve_auth", "stored_secret"]


@dataclass(frozen=True, slots=True)
class HttpAuth:
    """Resolved auth: a bearer token, an HMAC v2 key (and its header) or a Standard Webhooks
    key; all None: no auth."""

    bearer: str | None = None
    hmac: bytes | None = None
    hmac_header: str = ""
    webhook_key: bytes | None = None

    def add_headers(
        self,
        headers: dict[str, str],
        method: str,
        url: str,
        body: bytes,
        msg_id: Callable[[], str],
    ) -> None:
        """Add the request's auth headers (``msg_id`` gives a Standard Webhooks message id)."""
        if self.bearer is not None:
            headers["authorization"] = f"Bearer {self.bearer}"
        if self.hmac is not None:
            headers[self.hmac_header] = sign_request(self.hmac, method, url, headers, body)
        if self.webhook_key is not None:
            headers.update(webhook_headers(self.webhook_key, body, msg_id=msg_id()))


def resolve_auth(auth: HttpSinkAuthConfig | None, where: str) -> HttpAuth:
    """Resolve ``auth``'s secret reference (``where`` names the sender in errors).

    Raises:
        ConfigError: the reference does not resolve, or a Standard Webhooks secret is not a
            ``whsec_`` key (the message names the reference, never the value).
    """
    if auth is None:
        return HttpAuth()
    if auth.bearer is not None:
        return HttpAuth(bearer=auth.bearer.token.resolve(f"{where} bearer token"))
    if auth.hmac_sha256 is not None:
        secret = auth.hmac_sha256.secret.resolve(f"{where} hmac_sha256 secret")
        return HttpAuth(hmac=secret.encode(), hmac_header=auth.hmac_sha256.header.lower())
    if auth.standard_webhooks is not None:
        label = f"{where} standard_webhooks secret"
        try:
            return HttpAuth(
                webhook_key=decode_secret(auth.standard_webhooks.secret.resolve(label), label)
            )
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return HttpAuth()


def stored_secret(auth: HttpSinkAuthConfig | None) -> bool:
    """Whether ``auth``'s secret is stored on the stack (``{secret: NAME}``): a sender reads
    it again now and then, so a rotated secret is picked up without a restart."""
    if auth is None:
        return False
    refs = [
        auth.bearer.token if auth.bearer else None,
        auth.hmac_sha256.secret if auth.hmac_sha256 else None,
        auth.standard_webhooks.secret if auth.standard_webhooks else None,
    ]
    return any(r is not None and r.secret is not None for r in refs)


def open_client(max_concurrency: int, timeout_s: float, verify_tls: bool) -> Any:
    """The sender's connection pool: ``max_concurrency`` connections, no redirects followed,
    no proxy settings from the environment."""
    import httpx

    n = max_concurrency
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
        timeout=httpx.Timeout(timeout_s),
        follow_redirects=False,
        verify=verify_tls,
        trust_env=False,
    )
