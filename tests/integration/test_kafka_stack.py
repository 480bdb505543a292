"""``eventbus up --broker kafka``: the durable local stack on Apache Kafka (KRaft).

The test adopts the session's Ray and Redis (``--ray-address``, ``--redis-url``) so that only
the broker is started here: what it proves is the broker part of ``up``/``down``: records
written before ``down`` are read back after the next ``up``, on the same address.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventbus import CloudEvent
from eventbus.eventing._publish import publish_events
from tests.integration.kafka_helpers import collect

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.kafka_only]

ROOT = Path(__file__).resolve().parents[2]


def eb(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "EVENTBUS_"))}
    base.update({"EVENTBUS_HOME": str(home), "COLUMNS": "200"})
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "eventbus.cli", *args],
        capture_output=True,
        text=True,
        env=base,
        timeout=240,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.timeout(400)
def test_up_with_apache_kafka_keeps_records_across_down_and_up(
    tmp_path: Path, ray_cluster: None, redis_url: str
) -> None:
    import ray

    home = tmp_path / "eb"
    adopt = ["--ray-address", ray.get_runtime_context().gcs_address, "--redis-url", redis_url]
    up = eb(home, "up", "--broker", "kafka", "--no-gateway", *adopt)
    assert up.returncode == 0, up.stdout + up.stderr
    stack = json.loads((home / "stack.json").read_text())
    assert stack["owned"]["kafka"]["kind"] == "kafka"
    bootstrap = stack["kafka_bootstrap"]
    assert (home / "kafka" / "node1" / "data" / "meta.properties").exists()

    events = [CloudEvent.create(type="t", source="s", id=f"e{i}", data={"i": i}) for i in range(50)]
    asyncio.run(publish_events(bootstrap, "kept", events))

    down = eb(home, "down")
    assert down.returncode == 0 and "kafka" in down.stdout, down.stdout + down.stderr
    up2 = eb(home, "up", "--broker", "kafka", "--no-gateway", *adopt)
    assert up2.returncode == 0, up2.stdout + up2.stderr
    try:
        again = json.loads((home / "stack.json").read_text())["kafka_bootstrap"]
        assert again == bootstrap  # the same port: clients keep their address
        got = asyncio.run(collect(again, "kept", 50, timeout_s=60))
        assert sorted(e.id for e in got) == sorted(e.id for e in events)
    finally:
        eb(home, "down")


def test_up_refuses_an_unknown_broker_and_a_broker_with_a_bootstrap(tmp_path: Path) -> None:
    res = eb(tmp_path / "eb", "up", "--broker", "rabbitmq")
    assert res.returncode == 2
    assert "--broker 'rabbitmq': use tansu (embedded) or kafka (Apache Kafka)" in res.stderr
    res = eb(tmp_path / "eb", "up", "--broker", "kafka", "--kafka-bootstrap", "127.0.0.1:9092")
    assert res.returncode == 2
    assert "leave out --kafka-bootstrap" in res.stderr


def test_a_missing_java_is_named_with_the_fix(tmp_path: Path) -> None:
    res = eb(
        tmp_path / "eb",
        "up",
        "--broker",
        "kafka",
        "--no-gateway",
        env={"JAVA_HOME": str(tmp_path / "no-jdk"), "PATH": os.path.dirname(sys.executable)},
    )
    assert res.returncode == 1
    assert "needs Java 17 or newer" in res.stdout + res.stderr
    assert "--broker tansu" in res.stdout + res.stderr
