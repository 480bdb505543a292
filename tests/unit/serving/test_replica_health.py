"""A replica whose sources thread died or whose sources loop is stuck reports unhealthy."""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace

import pytest

from eventbus.eventing.sources._kafka_errors import SourceStalledError
from eventbus.serving._deployment import PipelineDeployment
from eventbus.serving._replica_health import SourcesHealth
from eventbus.serving._replica_sources import ReplicaSources


def replica_sources() -> ReplicaSources:
    config = SimpleNamespace(name="orders")  # only the name is read before start()
    return ReplicaSources(None, config, "127.0.0.1:1", None)  # type: ignore[arg-type]


def test_a_dead_sources_thread_fails_the_health_check_with_its_error() -> None:
    sources = replica_sources()
    sources._thread = threading.Thread(target=lambda: None)
    sources._thread.start()
    sources._thread.join()
    sources._error = SourceStalledError("orders", "sink", 300.0, "ConnectionError: down")
    deployment = SimpleNamespace(_sources=sources)
    with pytest.raises(
        RuntimeError, match=re.escape("stopped on this replica (SourceStalledError")
    ):
        PipelineDeployment.check_health(deployment)  # type: ignore[arg-type]


def test_a_stuck_sources_loop_fails_the_health_check_and_a_turning_one_passes() -> None:
    sources = replica_sources()
    sources.health = SourcesHealth("orders", stuck_after_s=0.05)
    release = threading.Event()
    sources._thread = threading.Thread(target=release.wait)
    sources._thread.start()
    try:
        sources.health.beat()
        sources.check_health()  # alive and turning
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # no beat: it becomes stuck after 0.05 s
            try:
                sources.check_health()
            except RuntimeError as e:
                assert "has not turned for" in str(e)
                break
        else:
            pytest.fail("a loop that stopped beating was still reported healthy")
    finally:
        release.set()
        sources._thread.join()


def test_stopping_on_purpose_and_no_sources_are_healthy() -> None:
    sources = replica_sources()
    sources._thread = threading.Thread(target=lambda: None)
    sources._thread.start()
    sources._thread.join()
    sources.stop(timeout_s=1)
    sources.check_health()  # stopped on purpose (redeploy, delete): not unhealthy
    PipelineDeployment.check_health(SimpleNamespace(_sources=None))  # type: ignore[arg-type]
