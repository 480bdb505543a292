"""Secrets as platform objects: ``eventbus secret set NAME`` stores a value in the stack's
Redis, encrypted, and pipelines reference it as ``{secret: NAME}``.

Values are encrypted with Fernet (AES-128-CBC + HMAC-SHA256, the ``cryptography`` package)
under one key per stack: ``$EVENTBUS_SECRET_KEY`` (a Fernet key) where set, else the file
``$EVENTBUS_HOME/secret.key`` (0600, created by the first ``secret set``). Redis holds only
ciphertext; whoever resolves a reference (the gateway, a replica) needs the key. Every change
increments :data:`keys.SECRETS_VERSION` in the same transaction, so readers re-read the
secrets only when one changed. Nothing here logs a value.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eventbus._internal import keys
from eventbus.errors import ConfigError

__all__ = [
    "KEY_ENV",
    "MAX_VALUE_BYTES",
    "NAME_PATTERN",
    "SecretStore",
    "check_name",
    "configure",
    "configured",
    "decrypt_records",
    "env_digest",
    "env_digests",
    "load_key",
    "lookup",
]

#: The environment variable holding the stack's Fernet key (else ``$EVENTBUS_HOME/secret.key``).
KEY_ENV = "EVENTBUS_SECRET_KEY"
#: A secret's name: letters, digits, ``_``, ``.`` and ``-``, starting with a letter.
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$"
#: The largest value stored (bytes): secrets are keys and tokens, not files.
MAX_VALUE_BYTES = 64 * 1024
_NAME = re.compile(NAME_PATTERN)


def check_name(name: str) -> str:
    """``name`` if it is a valid secret name.

    Raises:
        ConfigError: naming the name, the rule and an example.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = name if len(str(name)) <= 60 else f"{str(name)[:60]}... ({len(str(name))} chars)"
        msg = (
            f"secret name {shown!r} is not valid: use 1-128 letters, digits, '_', '.' or '-', "
            "starting with a letter (e.g. PAYMENTS_HMAC)"
        )
        raise ConfigError(msg)
    return name


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("EVENTBUS_HOME") or Path.home() / ".eventbus")


def load_key(environ: Mapping[str, str] | None = None, *, create: bool = False) -> bytes:
    """The stack's Fernet key: ``$EVENTBUS_SECRET_KEY``, else ``$EVENTBUS_HOME/secret.key``.

    Args:
        environ: where to look (default ``os.environ``).
        create: make the key file (0600) when neither exists (``secret set``).

    Raises:
        ConfigError: no key (and ``create`` is False), or the key is not a Fernet key.
    """
    from cryptography.fernet import Fernet

    env = os.environ if environ is None else environ
    raw = env.get(KEY_ENV)
    where = f"${KEY_ENV}"
    if not raw:
        path = _home(env) / "secret.key"
        where = str(path)
        if not path.exists():
            if not create:
                msg = (
                    f"no secret key here: neither ${KEY_ENV} nor {path} exists; run "
                    "`eventbus secret set` once on the stack's machine (it creates the key), or "
                    f"export {KEY_ENV} with the stack's key where this process runs"
                )
                raise ConfigError(msg)
            from eventbus._internal.stack_secrets import write_private

            path.parent.mkdir(parents=True, exist_ok=True)
            write_private(path, Fernet.generate_key().decode(), replace=False)
        raw = path.read_text(encoding="utf-8").strip()
    try:
        Fernet(raw.encode())
    except ValueError:
        msg = f"the secret key in {where} is not a Fernet key (32 url-safe base64-encoded bytes); make one with `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`"
        raise ConfigError(msg) from None
    return raw.encode()


class SecretStore:
    """The stack's secrets in Redis (a synchronous ``redis`` client).

    Args:
        redis: a ``redis.Redis`` client (``_internal.redis_client.connect``).
        key: the Fernet key (:func:`load_key`); None: names only (``list``, ``delete``).
    """

    def __init__(self, redis: Any, key: bytes | None = None) -> None:
        self._redis = redis
        self._fernet: Any = None
        if key is not None:
            from cryptography.fernet import Fernet

            self._fernet = Fernet(key)

    def set(self, name: str, value: bytes) -> bool:
        """Store (or rotate) ``name``; True when it existed before.

        Raises:
            ConfigError: a bad name, an empty or too large value, or no key.
        """
        check_name(name)
        if not value:
            msg = f"secret {name!r}: the value is empty; give it on stdin or with --file"
            raise ConfigError(msg)
        if len(value) > MAX_VALUE_BYTES:
            msg = f"secret {name!r}: the value has {len(value)} bytes, more than {MAX_VALUE_BYTES}; secrets are keys and tokens (reference a large file with {{file: PATH}})"
            raise ConfigError(msg)
        token = self._need_key(name).encrypt(value).decode()
        record = json.dumps({"token": token, "updated_at": time.time()})
        pipe = self._redis.pipeline(transaction=True)
        pipe.hexists(keys.SECRETS, name)
        pipe.hset(keys.SECRETS, name, record)
        pipe.incr(keys.SECRETS_VERSION)
        existed, _, _ = pipe.execute()
        return bool(existed)

    def delete(self, name: str) -> bool:
        """Forget ``name``; False when there was no such secret."""
        check_name(name)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hdel(keys.SECRETS, name)
        pipe.incr(keys.SECRETS_VERSION)
        removed, _ = pipe.execute()
        return bool(removed)

    def list(self) -> list[dict[str, Any]]:
        """Each secret's ``name`` and ``updated_at`` (never a value), sorted by name."""
        out = []
        for name, raw in self._redis.hgetall(keys.SECRETS).items():
            n = name.decode() if isinstance(name, bytes) else name
            try:
                updated = json.loads(raw).get("updated_at")
            except ValueError:
                updated = None
            out.append({"name": n, "updated_at": updated})
        return sorted(out, key=lambda r: r["name"])

    def version(self) -> int:
        """The change counter (0 before the first change)."""
        return int(self._redis.get(keys.SECRETS_VERSION) or 0)

    def get(self, name: str) -> bytes | None:
        """The value of ``name``, None when there is no such secret.

        Raises:
            ConfigError: no key, or a value the key does not decrypt (another stack's key).
        """
        raw = self._redis.hget(keys.SECRETS, name)
        if raw is None:
            return None
        return self._decrypt(name, raw)

    def all(self) -> dict[str, bytes]:
        """Every secret's value (the gateway's routes resolve from one read)."""
        return {
            (n.decode() if isinstance(n, bytes) else n): self._decrypt(str(n), raw)
            for n, raw in self._redis.hgetall(keys.SECRETS).items()
        }

    def _decrypt(self, name: str, raw: str | bytes) -> bytes:
        from cryptography.fernet import InvalidToken

        fernet = self._need_key(name)
        try:
            token = json.loads(raw)["token"]
            return bytes(fernet.decrypt(token.encode()))
        except (InvalidToken, ValueError, KeyError, TypeError):
            msg = f"secret {name!r} does not decrypt with this process's key (${KEY_ENV} or $EVENTBUS_HOME/secret.key): it was stored with another key; set it again with `eventbus secret set {name}`"
            raise ConfigError(msg) from None

    def _need_key(self, name: str) -> Any:
        if self._fernet is None:
            msg = f"secret {name!r}: no secret key loaded in this process"
            raise ConfigError(msg)
        return self._fernet


class _Resolver:
    """This process's access to the stack's secrets (replicas resolve ``{secret: NAME}`` of
    their sinks with it): a store over the stack's Redis, values cached ``ttl_s`` so that a
    rotated secret is seen within that long."""

    def __init__(self, redis_url: str, ttl_s: float) -> None:
        self.redis_url = redis_url
        self.ttl_s = ttl_s
        self._store: SecretStore | None = None
        self._cache: dict[str, tuple[float, bytes | None]] = {}

    def get(self, name: str) -> bytes | None:
        now = time.monotonic()
        hit = self._cache.get(name)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        if self._store is None:
            from eventbus._internal.redis_client import connect

            self._store = SecretStore(connect(self.redis_url), load_key())
        value = self._store.get(name)
        self._cache[name] = (now, value)
        return value


_resolver: _Resolver | None = None


def configure(redis_url: str | None, ttl_s: float = 2.0) -> None:
    """Let this process resolve ``{secret: NAME}`` from the stack at ``redis_url`` (None:
    forget it)."""
    global _resolver
    _resolver = _Resolver(redis_url, ttl_s) if redis_url else None


def configured() -> bool:
    """Whether :func:`configure` gave this process the stack's secrets."""
    return _resolver is not None


def lookup(name: str) -> bytes:
    """The value of secret ``name`` (cached briefly: a rotation is seen within seconds).

    Raises:
        ConfigError: this process has no access to the stack's secrets, or no such secret.
    """
    if _resolver is None:
        msg = f"secret {name!r}: this process is not connected to a stack's secrets (references {{secret: NAME}} resolve on the stack: the gateway and the replicas)"
        raise ConfigError(msg)
    value = _resolver.get(name)
    if value is None:
        msg = f"secret {name!r} is not set on the stack; set it with `eventbus secret set {name}` (value on stdin)"
        raise ConfigError(msg)
    return value


def decrypt_records(records: Mapping[str, str], key: bytes) -> tuple[dict[str, bytes], list[str]]:
    """The values of ``HGETALL`` of :data:`keys.SECRETS` (name -> record), and a problem line
    per secret that does not decrypt with ``key`` (named, never shown)."""
    store = SecretStore(None, key)
    values: dict[str, bytes] = {}
    problems: list[str] = []
    for name, raw in records.items():
        try:
            values[name] = store._decrypt(name, raw)
        except ConfigError as e:
            problems.append(str(e))
    return values, problems


def env_digests(environ: Mapping[str, str]) -> list[str]:
    """The SHA-256 (hex) of each environment variable's name that has a value: what a gateway
    publishes so ``deploy`` can check ``{env: NAME}`` references without seeing the names."""
    import hashlib

    return sorted(hashlib.sha256(k.encode()).hexdigest() for k, v in environ.items() if v)


def env_digest(name: str) -> str:
    """See :func:`env_digests`."""
    import hashlib

    return hashlib.sha256(name.encode()).hexdigest()
