"""The keeper: one pipeline on several Ray clusters, and the traffic weight of each.

The registry of clusters is one JSON document
(:func:`eventbus._client._registry.dump_registry`) in the Redis key
``eventbus:keeper:clusters`` of the *keeper Redis*, or in a file. Clients
(:class:`eventbus.Client`) read it to find the gateways. Any Redis every client reaches
will do; a separate, persistent one outlives the clusters it describes (a cluster's own Redis
works too, but clients then keep their last copy while that cluster is down).

A deploy runs ``python -m eventbus.cli deploy`` once per cluster in a subprocess: a Ray driver
connects to one cluster per process (``ray.init`` is process-global), and each cluster has
its own auth token, read from its ``EVENTBUS_HOME`` (``stack.json``) or ``ray_token_file``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eventbus._client._registry import ClusterInfo, dump_registry, parse_registry
from eventbus._internal import keys
from eventbus.errors import ConfigError, DeployError

__all__ = ["DeployResult", "Keeper", "cluster_from_home", "deploy_failed"]

# Passed down to a deploy subprocess only as the cluster's own values.
_CLUSTER_ENV = (
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "EVENTBUS_",
)


@dataclass(frozen=True)
class DeployResult:
    """How a deploy went on one cluster.

    Attributes:
        cluster: the cluster's name.
        ok: whether ``eventbus deploy`` succeeded there.
        output: its last output lines (``deployed NAME version N`` or the error).
    """

    cluster: str
    ok: bool
    output: str


def cluster_from_home(name: str, home: str | Path, **overrides: Any) -> ClusterInfo:
    """A :class:`ClusterInfo` from the ``stack.json`` of an ``EVENTBUS_HOME`` (``eventbus up``).

    Args:
        name: the cluster's name.
        home: the directory ``eventbus up`` ran with.
        **overrides: fields to set instead of the recorded ones (None values are ignored).

    Raises:
        ConfigError: no stack is recorded there.
    """
    from eventbus._internal.stack import load_stack

    stack = load_stack(Path(home))
    if stack is None:
        msg = f"no stack is recorded in {home} (no stack.json); run `EVENTBUS_HOME={home} eventbus up` first, or give the addresses"
        raise ConfigError(msg)
    fields: dict[str, Any] = {
        "gateway": stack.gateway_http,
        "grpc": stack.gateway_grpc,
        "ray_address": stack.ray_address,
        "kafka": stack.kafka_bootstrap,
        "redis": stack.redis_url,
        "home": str(Path(home).resolve()),
        "ray_token_file": stack.ray_auth_token_path,
    }
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return ClusterInfo(name=name, **fields)


class Keeper:
    """Registry of clusters, deploys to each, traffic weights.

    Args:
        location: ``redis://...`` (the registry lives in the key ``eventbus:keeper:clusters``)
            or the path of a JSON file.

    Example:
        >>> keeper = Keeper("redis://127.0.0.1:6379/0")  # doctest: +SKIP
        >>> keeper.add(cluster_from_home("blue", "~/.eventbus-blue"))  # doctest: +SKIP
        >>> keeper.add(cluster_from_home("green", "~/.eventbus-green", weight=0))  # doctest: +SKIP
        >>> keeper.deploy("orders.yaml")  # doctest: +SKIP
        >>> keeper.set_weights({"blue": 0, "green": 100})  # doctest: +SKIP
    """

    def __init__(self, location: str) -> None:
        self.location = location
        self._redis = location.startswith(("redis://", "rediss://", "unix://"))

    # One read-modify-write of the document; in Redis under WATCH, so two keepers never
    # overwrite each other's change.
    def _update(
        self, change: Callable[[list[ClusterInfo]], list[ClusterInfo]]
    ) -> list[ClusterInfo]:
        if not self._redis:
            path = Path(self.location)
            clusters = change(parse_registry(path.read_bytes()) if path.exists() else [])
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(dump_registry(clusters), encoding="utf-8")
            tmp.replace(path)
            return clusters
        import redis

        from eventbus._internal.redis_client import connect

        r = connect(self.location, socket_timeout=5.0, socket_connect_timeout=5.0)
        out: list[list[ClusterInfo]] = []

        def tx(pipe: Any) -> None:
            raw = pipe.get(keys.KEEPER_CLUSTERS)
            clusters = change([] if raw is None else parse_registry(raw))
            pipe.multi()
            pipe.set(keys.KEEPER_CLUSTERS, dump_registry(clusters))
            out[:] = [clusters]

        try:
            r.transaction(tx, keys.KEEPER_CLUSTERS)
        except redis.RedisError as exc:
            msg = f"cannot write the keeper registry at {self.location}: {exc}"
            raise ConfigError(msg) from None
        finally:
            r.close()
        return out[0]

    def clusters(self) -> list[ClusterInfo]:
        """The registered clusters."""
        from eventbus._client._registry import read_registry

        try:
            if self._redis:
                return read_registry(keeper_redis=self.location)
            return read_registry(keeper_file=self.location)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - Redis and OS errors alike: name the place
            msg = f"cannot read the keeper registry at {self.location}: {exc}"
            raise ConfigError(msg) from None

    def get(self, name: str) -> ClusterInfo:
        """One cluster by name.

        Raises:
            ConfigError: no cluster of that name.
        """
        clusters = self.clusters()
        for c in clusters:
            if c.name == name:
                return c
        raise _unknown(name, clusters)

    def add(self, cluster: ClusterInfo) -> bool:
        """Register a cluster, or replace the one of the same name; True when it is new.

        Raises:
            ConfigError: it has neither an HTTP gateway nor a gRPC address.
        """
        if cluster.gateway is None and cluster.grpc is None:
            msg = f"cluster {cluster.name!r} needs a gateway: give --gateway URL and/or --grpc HOST:PORT (or --home of a stack with one)"
            raise ConfigError(msg)
        new = [True]

        def change(clusters: list[ClusterInfo]) -> list[ClusterInfo]:
            new[0] = all(c.name != cluster.name for c in clusters)
            return [cluster if c.name == cluster.name else c for c in clusters] + (
                [cluster] if new[0] else []
            )

        self._update(change)
        return new[0]

    def remove(self, name: str) -> None:
        """Unregister a cluster (nothing is deleted on it).

        Raises:
            ConfigError: no cluster of that name.
        """

        def change(clusters: list[ClusterInfo]) -> list[ClusterInfo]:
            if all(c.name != name for c in clusters):
                raise _unknown(name, clusters)
            return [c for c in clusters if c.name != name]

        self._update(change)

    def set_weights(self, weights: Mapping[str, int]) -> list[ClusterInfo]:
        """Set the weights of some clusters in one write (blue-green: ``{"blue": 0, "green": 100}``).

        Raises:
            ConfigError: an unknown cluster or a negative weight (nothing is changed).
        """

        def change(clusters: list[ClusterInfo]) -> list[ClusterInfo]:
            names = {c.name for c in clusters}
            for n in weights:
                if n not in names:
                    raise _unknown(n, clusters)
            return [
                replace(c, weight=weights[c.name]) if c.name in weights else c for c in clusters
            ]

        return self._update(change)

    def deploy(
        self,
        file: str | Path,
        clusters: Iterable[str] | None = None,
        *,
        timeout_s: float = 300.0,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> list[DeployResult]:
        """Deploy a pipeline file to every registered cluster (or the named ones), one by one.

        Args:
            file: the pipeline YAML.
            clusters: names of the clusters to deploy to (default: all).
            timeout_s: the longest one cluster's deploy may take.
            env: the environment of the deploy subprocesses (default: this process's);
                Ray and EventBus variables in it are replaced by the cluster's own.
            cwd: their working directory (on the Python path of the pipeline's functions).

        Returns:
            One result per cluster, in registry order; every cluster is tried.

        Raises:
            ConfigError: an unknown cluster name, or no clusters registered.
        """
        registered = self.clusters()
        if clusters is None:
            targets = registered
        else:
            by_name = {c.name: c for c in registered}
            targets = []
            for n in clusters:
                if n not in by_name:
                    raise _unknown(n, registered)
                targets.append(by_name[n])
        if not targets:
            msg = "no clusters are registered; add one with `eventbus keeper add NAME --home DIR`"
            raise ConfigError(msg)
        base = dict(os.environ if env is None else env)
        return [_deploy_one(c, Path(file), base, timeout_s, cwd) for c in targets]


def _deploy_one(
    cluster: ClusterInfo,
    file: Path,
    base_env: dict[str, str],
    timeout_s: float,
    cwd: str | Path | None,
) -> DeployResult:
    env = {k: v for k, v in base_env.items() if not k.startswith(_CLUSTER_ENV)}
    argv = [sys.executable, "-m", "eventbus.cli", "deploy", str(file)]
    if cluster.home is not None:
        env["EVENTBUS_HOME"] = cluster.home
    else:
        # No stack.json to read: the CLI must not fall back on ~/.eventbus (another cluster).
        env["EVENTBUS_HOME"] = str(Path(cwd or ".").resolve() / ".eventbus-keeper-none")
        for part in ("ray_address", "kafka", "redis"):
            if getattr(cluster, part) is None:
                return DeployResult(
                    cluster.name,
                    False,
                    f"cluster {cluster.name!r} has no {part} and no --home: re-add it with --home DIR or --ray-address/--kafka-bootstrap/--redis-url",
                )
    if cluster.ray_token_file is not None:
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": cluster.ray_token_file})
    for flag, value in (
        ("--ray-address", cluster.ray_address),
        ("--kafka-bootstrap", cluster.kafka),
        ("--redis-url", cluster.redis),
        ("--kafka-config", cluster.kafka_config),
    ):
        if value is not None:
            argv += [flag, value]
    env.setdefault("COLUMNS", "200")
    try:
        proc = subprocess.run(
            argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return DeployResult(
            cluster.name, False, f"the deploy did not finish within {timeout_s:.0f} s"
        )
    text = (proc.stdout + proc.stderr).strip()
    return DeployResult(cluster.name, proc.returncode == 0, "\n".join(text.splitlines()[-5:]))


def _unknown(name: str, clusters: list[ClusterInfo]) -> ConfigError:
    known = ", ".join(c.name for c in clusters) or "none"
    return ConfigError(
        f"no cluster named {name!r} is registered (registered: {known}); see `eventbus keeper list`"
    )


def deploy_failed(results: list[DeployResult]) -> DeployError | None:
    """A DeployError naming each cluster where the deploy failed, or None."""
    bad = [r for r in results if not r.ok]
    if not bad:
        return None
    return DeployError(
        "; ".join(
            f"{r.cluster}: {r.output.splitlines()[-1] if r.output else 'failed'}" for r in bad
        )
    )
