"""The controller's side of shared hosts (``serving.host``; the replicas' side is ``_host``).

Each host's membership is kept in Redis (``keys.HOSTS``: host -> ``{"members": {pipeline:
{"document", "python_path", "stamp"}}}``), next to the pipeline records, so a restarted
controller finds it; the host's Serve application carries it as its ``user_config``, so a
restarted host replica finds it too. A member's stamp changes at each of its deploys (its
replica side restarts it); the other members' stamps stay (they are not touched).

The controller changes pipelines under one lock each (``_locks``); a host's membership is
shared by its members, so joins and leaves hold the hosts' own lock (a member's join reads
the members, adds itself and applies them: two at once would lose one).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any

from eventbus._internal import keys
from eventbus.errors import DeployError
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._host import build_host_app, host_app_name
from eventbus.serving._locks import SERVE_RUN

__all__ = ["Hosts"]

log = logging.getLogger("eventbus.serving.host")

#: How long a deploy waits for a new member to report that it runs on the host.
_MEMBER_WAIT_S = 60.0


class Hosts:
    """Joins pipelines to shared hosts and takes them out again.

    Args:
        redis: the controller's Redis client (``decode_responses=True``).
        runtime: what every member's replica side gets (Kafka, Redis).
    """

    def __init__(self, redis: Any, runtime: dict[str, Any]) -> None:
        self._redis = redis
        self._runtime = runtime
        # re-entrant: a join first leaves every other host
        self._lock = threading.RLock()

    def members(self, host: str) -> dict[str, dict[str, Any]]:
        """The stored members of a host (empty: no such host)."""
        raw = self._redis.hget(keys.HOSTS, host)
        members: dict[str, dict[str, Any]] = json.loads(raw)["members"] if raw else {}
        return members

    def host_of(self, pipeline: str) -> str | None:
        """The host a pipeline runs on, as stored (None: none)."""
        for host, raw in self._redis.hgetall(keys.HOSTS).items():
            if pipeline in json.loads(raw)["members"]:
                return str(host)
        return None

    def join(self, config: PipelineConfig, python_path: list[str]) -> None:
        """Run a pipeline (again, at a new stamp) on its host; only it (re)starts there.

        Raises:
            DeployError: it did not start on the host (its error named); the host's other
                members run on.
        """
        host = config.spec.serving.host
        assert host is not None  # callers check
        with self._lock:
            self.leave(config.name, keep=host)
            members = self.members(host)
            stamp = uuid.uuid4().hex[:12]
            members[config.name] = {
                "document": config.to_document(),
                "python_path": python_path,
                "stamp": stamp,
            }
            self._apply(host, members)
            self._wait_started(host, config.name, stamp)

    def leave(self, pipeline: str, keep: str | None = None) -> bool:
        """Take a pipeline off every host but ``keep`` (drained and committed there; the
        other members are not touched). Whether it was on one."""
        found = False
        with self._lock:
            for host, raw in self._redis.hgetall(keys.HOSTS).items():
                members = json.loads(raw)["members"]
                if host == keep or pipeline not in members:
                    continue
                del members[pipeline]
                self._apply(host, members)
                found = True
        return found

    def ensure(self, running: set[str], records: dict[str, dict[str, Any]]) -> None:
        """After a controller (re)start: members whose pipeline record is gone or names
        another host leave; each host whose application is missing runs again."""
        with self._lock:
            for host, raw in self._redis.hgetall(keys.HOSTS).items():
                members = json.loads(raw)["members"]
                kept = {
                    name: m
                    for name, m in members.items()
                    if name in records
                    and records[name]["document"]["spec"].get("serving", {}).get("host") == host
                }
                if kept != members or (kept and host_app_name(host) not in running):
                    self._apply(host, kept)

    def _apply(self, host: str, members: dict[str, dict[str, Any]]) -> None:
        from ray import serve

        if not members:
            self._redis.hdel(keys.HOSTS, host)
            try:
                serve.delete(host_app_name(host))
            except Exception:
                log.exception("deleting the Serve application of host %r failed", host)
            return
        self._redis.hset(keys.HOSTS, host, json.dumps({"members": members}))
        with SERVE_RUN:  # serve.run is not thread-safe (_locks)
            serve.run(
                build_host_app(host, members, self._runtime),
                name=host_app_name(host),
                route_prefix=None,
            )

    def _wait_started(self, host: str, pipeline: str, stamp: str) -> None:
        """Every replica reconfigures before Serve calls the update done; ask one of them
        whether the member runs at this stamp (its constructor may have failed).

        Raises:
            DeployError: the member's error on the host, or no answer in time.
        """
        from ray import serve

        handle: Any = serve.get_app_handle(host_app_name(host))
        deadline = time.monotonic() + _MEMBER_WAIT_S
        while True:
            state = handle.members.remote().result(timeout_s=30).get(pipeline)
            if state is not None and state["stamp"] == stamp:
                if state["error"]:
                    msg = f"it did not start on host {host!r}: {state['error']}"
                    raise DeployError(msg)
                return
            if time.monotonic() > deadline:
                msg = f"host {host!r} did not start it within {_MEMBER_WAIT_S:.0f} s"
                raise DeployError(msg)
            time.sleep(0.1)
