"""The controller's side of shared hosts (``serving._host_control.Hosts``) on a real Redis,
its Serve application stood in for: pipelines of one host join and leave it under the hosts'
own lock (the controller's locks are per pipeline), so two members joining at once both stay
members; the second reads the members only after the first applied them."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from eventbus._internal import keys
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._host_control import Hosts

WAIT_S = 60.0


def member(name: str, host: str) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": "in"}}],
                "steps": [],
                "sink": {"kafka": {"topic": "out"}},
                "serving": {"host": host},
            },
        }
    )


class HeldHosts(Hosts):
    """Applies memberships to Redis only (no Serve); the first apply waits for ``go``."""

    def __init__(self, client: Any) -> None:
        super().__init__(client, {})
        self.applied: list[list[str]] = []
        self.entered = threading.Event()
        self.go = threading.Event()

    def _apply(self, host: str, members: dict[str, dict[str, Any]]) -> None:
        if not self.applied:
            self.entered.set()
            assert self.go.wait(WAIT_S)
        self.applied.append(sorted(members))
        if members:
            self._redis.hset(keys.HOSTS, host, json.dumps({"members": members}))
        else:
            self._redis.hdel(keys.HOSTS, host)

    def _wait_started(self, host: str, pipeline: str, stamp: str) -> None:
        pass


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    yield r
    r.close()


@pytest.fixture
def host(client: redis.Redis) -> Iterator[str]:
    name = f"host-{uuid.uuid4().hex[:8]}"
    yield name
    client.hdel(keys.HOSTS, name)


def test_two_members_joining_at_once_both_stay(client: redis.Redis, host: str) -> None:
    hosts = HeldHosts(client)
    first = threading.Thread(target=hosts.join, args=(member("a", host), []), daemon=True)
    first.start()
    try:
        assert hosts.entered.wait(WAIT_S)
        second = threading.Thread(target=hosts.join, args=(member("b", host), []), daemon=True)
        second.start()
        second.join(0.5)  # it cannot apply while the first one's apply runs, however long
        assert second.is_alive(), f"b joined during a's apply: {hosts.applied}"
    finally:
        hosts.go.set()
    for t in (first, second):
        t.join(WAIT_S)
        assert not t.is_alive()
    assert hosts.applied == [["a"], ["a", "b"]]
    assert sorted(hosts.members(host)) == ["a", "b"]
    assert hosts.host_of("b") == host


def test_a_leave_during_a_join_keeps_the_joined_member(client: redis.Redis, host: str) -> None:
    hosts = HeldHosts(client)
    hosts.go.set()
    hosts.join(member("a", host), [])
    hosts.join(member("b", host), [])
    hosts.applied.clear()
    hosts.go.clear()
    joining = threading.Thread(target=hosts.join, args=(member("c", host), []), daemon=True)
    joining.start()
    try:
        assert hosts.entered.wait(WAIT_S)
        leaving = threading.Thread(target=hosts.leave, args=("a",), daemon=True)
        leaving.start()
        leaving.join(0.5)  # it cannot apply while c's join applies, however long
        assert leaving.is_alive(), f"a left during c's join: {hosts.applied}"
    finally:
        hosts.go.set()
    for t in (joining, leaving):
        t.join(WAIT_S)
        assert not t.is_alive()
    assert sorted(hosts.members(host)) == ["b", "c"]
    assert hosts.leave("a") is False, "a left already"
