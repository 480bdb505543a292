"""The shared host's replica side without Ray: members come and go by ``reconfigure``, each
runs its own steps, a restamped member alone is replaced, and a member that cannot start or a
call for a pipeline the host does not run is that pipeline's error, never the host's."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from eventbus import CloudEvent
from eventbus.serving._host import HostDeployment, MemberHandle, host_app_name, serving_app


def doc(name: str, expr: str = "data.n > 1", function: str | None = None) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"id": "keep", "filter": expr}]
    if function is not None:
        steps.append({"id": "call", "function": function})
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": f"{name}-in"}}],
            "steps": steps,
            "sink": {"kafka": {"topic": f"{name}-out"}},
            "serving": {"host": "shared", "replicas": 1},
        },
    }


def spec(document: dict[str, Any], stamp: str) -> dict[str, Any]:
    return {"document": document, "python_path": [], "stamp": stamp}


def events(*ns: int) -> list[CloudEvent]:
    return [CloudEvent.create(type="t", source="/s", id=f"e{n}", data={"n": n}) for n in ns]


def kept(outcomes: list[Any]) -> list[int]:
    return [i for i, o in enumerate(outcomes) if isinstance(o, list) and o]


def test_members_come_and_go_and_only_a_restamped_one_is_replaced() -> None:
    host = HostDeployment("shared", {})  # no Kafka, no Redis: members without sources
    asyncio.run(
        host.reconfigure(
            {"members": {"a": spec(doc("a"), "1"), "b": spec(doc("b", "data.n > 5"), "1")}}
        )
    )
    assert host.members() == {
        "a": {"stamp": "1", "error": None},
        "b": {"stamp": "1", "error": None},
    }
    b_before = host._members["b"]
    assert kept(asyncio.run(host.process_member("a", events(0, 2, 9)))) == [1, 2]
    assert kept(asyncio.run(host.process_member("b", events(0, 2, 9)))) == [2]

    # a's new version: a replaced, b the very same object (not restarted)
    asyncio.run(
        host.reconfigure(
            {
                "members": {
                    "a": spec(doc("a", "data.n > 8"), "2"),
                    "b": spec(doc("b", "data.n > 5"), "1"),
                }
            }
        )
    )
    assert host._members["b"] is b_before
    assert kept(asyncio.run(host.process_member("a", events(0, 2, 9)))) == [2]

    # a leaves: b runs on
    asyncio.run(host.reconfigure({"members": {"b": spec(doc("b", "data.n > 5"), "1")}}))
    assert set(host.members()) == {"b"} and host._members["b"] is b_before
    with pytest.raises(
        LookupError, match="pipeline 'a' does not run on host 'shared': it is not a member"
    ):
        asyncio.run(host.process_member("a", events(1)))


def test_a_member_that_cannot_start_is_its_own_error_and_the_others_run() -> None:
    host = HostDeployment("shared", {})
    broken = doc("c", function="tests.unit.serving.no_such_module:f")
    asyncio.run(host.reconfigure({"members": {"a": spec(doc("a"), "1"), "c": spec(broken, "1")}}))
    state = host.members()
    assert state["a"]["error"] is None
    assert "no_such_module" in (state["c"]["error"] or "")
    assert kept(asyncio.run(host.process_member("a", events(2)))) == [0]
    with pytest.raises(
        LookupError, match=r"pipeline 'c' does not run on host 'shared': .*no_such_module"
    ):
        asyncio.run(host.process_member("c", events(2)))
    host.check_health()  # members without sources: nothing to restart, nothing raised
    # the same stamp again is not retried; a new stamp (a fixed redeploy) is
    asyncio.run(host.reconfigure({"members": {"a": spec(doc("a"), "1"), "c": spec(doc("c"), "2")}}))
    assert host.members()["c"] == {"stamp": "2", "error": None}


def test_a_member_is_reached_through_its_hosts_application() -> None:
    assert host_app_name("shared") == "eventbus-host-shared"
    assert serving_app(doc("a")) == "eventbus-host-shared"
    alone = doc("a")
    del alone["spec"]["serving"]["host"]
    assert serving_app(alone) == "eventbus-a"

    calls: list[tuple[Any, ...]] = []

    class Method:
        def remote(self, *args: Any) -> str:
            calls.append(args)
            return "response"

    class Handle:
        process_member = Method()

        def options(self, **kwargs: Any) -> Handle:
            calls.append(("options", kwargs))
            return self

    handle = MemberHandle(Handle(), "a").options(_by_reference=False)
    assert handle.process.remote(["e"]) == "response"
    assert calls == [("options", {"_by_reference": False}), ("a", ["e"])]


def test_a_member_whose_sources_died_is_restarted_alone() -> None:
    host = HostDeployment("shared", {})
    asyncio.run(host.reconfigure({"members": {"a": spec(doc("a"), "1"), "b": spec(doc("b"), "1")}}))
    sick, well = host._members["a"], host._members["b"]

    def dead() -> None:
        msg = "the Kafka sources thread of pipeline 'a' died"
        raise RuntimeError(msg)

    sick.check_health = dead
    host.check_health()  # never raises: the host stays healthy
    deadline = time.monotonic() + 10
    while host._members.get("a") in (None, sick):
        assert time.monotonic() < deadline, "member a was not restarted"
        time.sleep(0.01)
    assert host._members["b"] is well
    assert host.members()["a"] == {"stamp": "1", "error": None}
    assert kept(asyncio.run(host.process_member("a", events(2)))) == [0]
