"""The gateway's view of the stack's secrets (``eventbus secret set``): read from Redis when
their version changes, so a new or rotated secret takes effect within a refresh (half a
second), without a restart; and what the gateway tells ``deploy`` about its environment (the
hashed names of its variables, so an ``{env: NAME}`` reference no gateway has is refused)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from eventbus._internal import keys
from eventbus._internal.secret_store import decrypt_records, env_digests, load_key
from eventbus.errors import ConfigError

__all__ = ["ENV_EVERY_S", "GatewaySecrets"]

log = logging.getLogger("eventbus.gateway.secrets")

#: How often a gateway rewrites its environment's entry (``deploy`` counts entries younger
#: than three times this as live gateways).
ENV_EVERY_S = 10.0


class GatewaySecrets:
    """The secrets' values by name, kept current by :meth:`update`.

    Args:
        environ: the gateway's environment (the key: ``$EVENTBUS_SECRET_KEY`` or
            ``$EVENTBUS_HOME/secret.key``; the variables it reports).
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.values: dict[str, bytes] = {}
        self.version: str | None = None
        self._key: bytes | None = None
        self._env_at = float("-inf")

    async def update(self, redis: Any, version: str | None) -> bool:
        """Re-read the secrets when ``version`` (of :data:`keys.SECRETS_VERSION`) moved;
        True when they were re-read (the routes must be resolved again)."""
        if version == self.version:
            return False
        records: dict[str, str] = await redis.hgetall(keys.SECRETS)
        self.version = version
        if not records:
            self.values = {}
            return True
        if self._key is None:
            try:
                self._key = load_key(self.environ)
            except ConfigError as e:
                log.error("the stack's secrets cannot be read here: %s", e)
                self.values = {}
                return True
        self.values, problems = decrypt_records(records, self._key)
        for p in problems:
            log.error("%s", p)
        return True

    async def publish_env(self, redis: Any, field: str, *, now: float | None = None) -> None:
        """Write this gateway's entry of :data:`keys.GATEWAY_ENV` (every :data:`ENV_EVERY_S`)."""
        now = time.time() if now is None else now
        if now - self._env_at < ENV_EVERY_S:
            return
        self._env_at = now
        body = json.dumps({"at": now, "env": env_digests(self.environ)})
        await redis.hset(keys.GATEWAY_ENV, field, body)

    async def forget_env(self, redis: Any, field: str) -> None:
        """Remove this gateway's entry (it stops)."""
        await redis.hdel(keys.GATEWAY_ENV, field)
