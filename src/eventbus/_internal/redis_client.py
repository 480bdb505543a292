"""Every Redis client EventBus makes comes from here: plain, TLS, ACL user, Redis Cluster.

One URL names the Redis of a stack, and the URL alone says how to reach it, so the one
``redis_url`` handed to the controller, gateways, replicas and source actors carries it all:

* ``redis://[USER:PASSWORD@]HOST:PORT/DB``: a single Redis (``USER`` is an ACL user; without
  it the password is the ``default`` user's).
* ``rediss://...``: the same over TLS. Query parameters set the TLS files and checks:
  ``ssl_ca_certs`` (CA bundle, PEM), ``ssl_certfile`` + ``ssl_keyfile`` (a client
  certificate), ``ssl_check_hostname=false`` and ``ssl_cert_reqs=none`` (tests only).
* ``redis+cluster://HOST:PORT`` / ``rediss+cluster://HOST:PORT``: a Redis Cluster, reached
  through any of its nodes; the client follows ``MOVED``/``ASK`` redirections. Every
  EventBus key carries a hash tag, so each script and transaction touches one slot
  (:mod:`eventbus._internal.keys`).

Clients connect lazily: a wrong password shows on the first command. :func:`check_redis`
pings once and turns what Redis refused into a message naming the URL (password
``***``) and the fix; :func:`explain` does that for an error caught elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from eventbus.errors import ConfigError, StackError

__all__ = [
    "QUERY_PARAMETERS",
    "check_redis",
    "connect",
    "connect_async",
    "explain",
    "is_cluster",
    "redact",
    "with_ca",
]

#: The query parameters a Redis URL may carry (others are refused: a typo would otherwise
#: surface as a ``TypeError`` deep inside the first connection).
QUERY_PARAMETERS = frozenset(
    {
        "db",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_cert_reqs",
        "ssl_check_hostname",
        "socket_timeout",
        "socket_connect_timeout",
        "health_check_interval",
        "max_connections",
        "protocol",
    }
)

_SCHEMES = {
    "redis": ("redis", False),
    "rediss": ("rediss", False),
    "redis+cluster": ("redis", True),
    "rediss+cluster": ("rediss", True),
    "unix": ("unix", False),
}


def redact(url: str) -> str:
    """A URL for display: its password (``redis://:PASSWORD@host``) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _parse(url: str) -> tuple[str, bool]:
    """The URL redis-py reads (``+cluster`` dropped) and whether it names a cluster."""
    parts = urlsplit(url)
    known = _SCHEMES.get(parts.scheme)
    if known is None:
        msg = (
            f"Redis URL {redact(url)!r}: unknown scheme {parts.scheme!r}; use one of "
            "redis://, rediss:// (TLS), redis+cluster://, rediss+cluster:// (Redis Cluster)"
        )
        raise ConfigError(msg)
    unknown = sorted({k for k, _ in parse_qsl(parts.query)} - QUERY_PARAMETERS)
    if unknown:
        msg = (
            f"Redis URL {redact(url)!r}: unknown query parameter(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(QUERY_PARAMETERS))}"
        )
        raise ConfigError(msg)
    scheme, cluster = known
    if cluster and parts.path.strip("/") not in ("", "0"):
        msg = (
            f"Redis URL {redact(url)!r}: a Redis Cluster has database 0 only; "
            f"got /{parts.path.strip('/')} (drop the path)"
        )
        raise ConfigError(msg)
    # the URL as given, but for the scheme (urlunsplit would turn unix:///path into unix:/path)
    return scheme + url[len(parts.scheme) :], cluster


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return _parse(url)[1]


def with_ca(url: str, ca_file: str | os.PathLike[str]) -> str:
    """``url`` with ``ssl_ca_certs`` set to ``ca_file`` (absolute), as ``--redis-ca`` does.

    Raises:
        ConfigError: ``url`` is not a TLS URL (``rediss://``, ``rediss+cluster://``), or
            ``ca_file`` is not a readable file.
    """
    parts = urlsplit(url)
    if not parts.scheme.startswith("rediss"):
        msg = (
            f"a CA file ({os.fspath(ca_file)}) is for TLS, but the Redis URL {redact(url)!r} "
            "is plaintext: use rediss:// (or rediss+cluster://)"
        )
        raise ConfigError(msg)
    path = Path(ca_file).resolve()
    if not path.is_file():
        msg = f"Redis CA file {os.fspath(ca_file)!r} does not exist: pass a PEM file"
        raise ConfigError(msg)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "ssl_ca_certs"]
    query.append(("ssl_ca_certs", str(path)))
    return urlunsplit(parts._replace(query=urlencode(query)))


def connect(url: str, **options: Any) -> Any:
    """A synchronous client of the Redis (or Redis Cluster) at ``url``.

    Args:
        url: see the module docstring.
        **options: redis-py client options (``decode_responses``, ``socket_timeout``...);
            the URL's query parameters win over them.

    Returns:
        A ``redis.Redis`` or, for a cluster URL, a ``redis.cluster.RedisCluster``.

    Raises:
        ConfigError: the URL has an unknown scheme or query parameter.
    """
    target, cluster = _parse(url)
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(target, **options)
    import redis

    return redis.Redis.from_url(target, **options)


def connect_async(url: str, **options: Any) -> Any:
    """A ``redis.asyncio`` client of ``url`` (see :func:`connect`).

    Raises:
        ConfigError: the URL has an unknown scheme or query parameter.
    """
    target, cluster = _parse(url)
    if cluster:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(target, **options)
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(target, **options)


def explain(url: str, exc: BaseException) -> str:
    """What went wrong reaching the Redis at ``url``, with the fix (the password redacted)."""
    import ssl

    import redis

    where = f"Redis at {redact(url)}"
    text = str(exc)
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in text:
        user = urlsplit(url).username or "default"
        return (
            f"{where} refused the credentials of user {user!r} (wrong password, or the ACL "
            f"user is missing or disabled): fix the user and password in the URL "
            f"(redis://USER:PASSWORD@HOST:PORT) or the server's ACL (ACL GETUSER {user})"
        )
    if "NOAUTH" in text:
        return (
            f"{where} requires a password and the URL has none: "
            "pass it in the URL (redis://USER:PASSWORD@HOST:PORT)"
        )
    if "NOPERM" in text:
        return (
            f"{where}: the ACL user lacks a permission EventBus needs ({text}); grant it "
            "(e.g. ACL SETUSER USER on ~eventbus:* +@all -@dangerous +info)"
        )
    if isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            f"{where}: its TLS certificate is not trusted ({cause or text}): pass the CA that "
            "signed it, e.g. rediss://HOST:PORT?ssl_ca_certs=/path/ca.pem (eventbus up "
            "--redis-ca FILE)"
        )
    if cause is not None or "SSL" in text:
        return (
            f"{where}: TLS failed ({cause or text}); check that the port speaks TLS "
            "(rediss://) or plaintext (redis://) and the ssl_* query parameters"
        )
    return f"{where} is unreachable ({type(exc).__name__}: {text}); check the host and port"


def check_redis(url: str, *, timeout_s: float = 5.0) -> None:
    """Ping the Redis at ``url`` once, so a wrong URL fails at start, not on the first event.

    Raises:
        ConfigError: the URL has an unknown scheme or query parameter.
        StackError: Redis is unreachable or refused the credentials or TLS handshake (the
            message names the URL, password redacted, and the fix).
    """
    import redis
    from redis.exceptions import RedisClusterException

    client = None
    try:
        # a cluster client reads the slot map here, so this can fail already
        client = connect(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        client.ping()
    except (redis.RedisError, RedisClusterException, OSError) as e:
        raise StackError(explain(url, e)) from None
    finally:
        if client is not None:
            client.close()
