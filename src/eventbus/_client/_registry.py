"""The keeper's registry of clusters: :class:`ClusterInfo` and its JSON document.

The keeper (``eventbus keeper``) writes the document to the Redis key :data:`KEEPER_KEY` (or a
file); clients and the keeper read it with :func:`read_registry`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from eventbus._internal import keys
from eventbus.errors import ConfigError

__all__ = ["KEEPER_KEY", "ClusterInfo", "dump_registry", "parse_registry", "read_registry"]

#: The keeper registry's Redis key (one JSON document; see :mod:`eventbus._internal.keys`).
KEEPER_KEY = keys.KEEPER_CLUSTERS


@dataclass(frozen=True)
class ClusterInfo:
    """One cluster as the keeper records it.

    Attributes:
        name: the cluster's name (``[a-z0-9_-]``), unique in the registry.
        gateway: the HTTP base URL of its gateway (``http://host:8080``).
        grpc: ``host:port`` of its gateway's gRPC service.
        ray_address: its Ray address (for deploys; the client never uses it).
        kafka: its Kafka bootstrap servers (for deploys).
        redis: its Redis URL (for deploys).
        home: an ``EVENTBUS_HOME`` whose ``stack.json`` describes it (for deploys).
        ray_token_file: the Ray auth token file of the cluster (a path on the keeper's host).
        kafka_config: its Kafka connection settings file (``--kafka-config``: TLS, SASL; secrets
            by reference), a path on the keeper's host, for deploys.
        weight: relative share of the traffic (0: none unless every other cluster is down).
        local: clients prefer this cluster while its weight is above 0.
    """

    name: str
    gateway: str | None = None
    grpc: str | None = None
    ray_address: str | None = None
    kafka: str | None = None
    redis: str | None = None
    home: str | None = None
    ray_token_file: str | None = None
    kafka_config: str | None = None
    weight: int = 100
    local: bool = False

    def __post_init__(self) -> None:
        if not self.name or not all(ch.isalnum() or ch in "-_" for ch in self.name):
            msg = f"cluster name {self.name!r} must be letters, digits, '-' or '_'"
            raise ConfigError(msg)
        if not isinstance(self.weight, int) or isinstance(self.weight, bool) or self.weight < 0:
            msg = f"cluster {self.name!r}: weight must be an integer >= 0; got {self.weight!r}"
            raise ConfigError(msg)
        if self.gateway is not None and not self.gateway.startswith(("http://", "https://")):
            msg = f"cluster {self.name!r}: gateway must be an http:// or https:// URL; got {self.gateway!r}"
            raise ConfigError(msg)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> ClusterInfo:
        """Build from a registry entry; unknown keys (a newer keeper's) are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in known})


def parse_registry(raw: str | bytes) -> list[ClusterInfo]:
    """The clusters of a registry document (``{"version": 1, "clusters": [...]}``).

    Raises:
        ConfigError: the document is not a registry.
    """
    try:
        doc = json.loads(raw)
        return [ClusterInfo.from_dict(c) for c in doc["clusters"]]
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"the keeper registry is not a valid document ({type(exc).__name__}: {exc}); rewrite it with `eventbus keeper add`"
        raise ConfigError(msg) from None


def dump_registry(clusters: Iterable[ClusterInfo]) -> str:
    """The registry document of ``clusters``."""
    return json.dumps(
        {"version": 1, "updated": time.time(), "clusters": [asdict(c) for c in clusters]}, indent=2
    )


def read_registry(
    *, keeper_redis: str | None = None, keeper_file: str | Path | None = None
) -> list[ClusterInfo]:
    """Read the keeper's registry from Redis (key :data:`KEEPER_KEY`) or from a file.

    Returns an empty list when nothing was registered yet.
    """
    if keeper_redis is not None:
        from eventbus._internal.redis_client import connect

        r = connect(keeper_redis, socket_timeout=2.0, socket_connect_timeout=2.0)
        try:
            raw = r.get(KEEPER_KEY)
        finally:
            r.close()
        return [] if raw is None else parse_registry(raw)
    if keeper_file is not None:
        path = Path(keeper_file)
        return parse_registry(path.read_bytes()) if path.exists() else []
    return []
