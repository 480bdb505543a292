"""Kafka topics are checked at deploy, watched while a pipeline runs, and named by the CLI.

A pipeline whose source, sink or dead-letter topic does not exist is refused (its YAML path,
the closest existing topic, the fix) unless the YAML says ``create:``; a topic deleted under a
running pipeline turns it DEGRADED with the reason; ``eventbus publish``/``tail`` refuse a
missing topic instead of waiting; invalid names never reach the broker.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient

from eventbus.errors import DeployError, PipelineConfigError

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]


def doc(
    name: str,
    src: str,
    sink: str,
    dlq: str | None = None,
    create: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pipeline; ``create`` = {"src"|"sink"|"dlq": {partitions: N}} adds ``create:``."""
    create = create or {}
    spec: dict[str, Any] = {
        "sources": [{"kafka": {"topic": src, **_c(create, "src")}}],
        "steps": [{"id": "tag", "convert": {"set": {"data.seen": "true"}}}],
        "sink": {"kafka": {"topic": sink, **_c(create, "sink")}},
        "serving": {"replicas": 1},
    }
    if dlq is not None:
        spec["dead_letter"] = {"kafka": {"topic": dlq, **_c(create, "dlq")}}
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": spec,
    }


def _c(create: dict[str, Any], key: str) -> dict[str, Any]:
    return {"create": create[key]} if key in create else {}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _describe(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has (0: it does not exist)."""

    async def run() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            if topic not in await admin.list_topics():
                return 0
            (desc,) = await admin.describe_topics([topic])
            return len(desc["partitions"])
        finally:
            await admin.close()

    return asyncio.run(run())


def _deploy_refused(eventbus_client: Any, tmp_path: Path, document: dict[str, Any]) -> str:
    path = tmp_path / f"{document['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(DeployError) as info:
        eventbus_client.deploy(path)
    names = [p["name"] for p in eventbus_client.list()]
    assert document["metadata"]["name"] not in names  # nothing half-deployed
    return str(info.value)


def test_misspelled_source_and_sink_topics_are_refused_with_did_you_mean(
    eventbus_client: Any, topic_factory: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    shop = topic_factory("shop")
    paid = topic_factory("paid")
    name = _name("typo")
    msg = _deploy_refused(eventbus_client, tmp_path, doc(name, shop + "p", paid[:-1] + "x"))
    # both problems at once, each with its YAML path, the close existing topic and the fix
    assert f"spec.sources[0].kafka.topic: topic {shop + 'p'!r} does not exist on" in msg
    assert f"(did you mean {shop!r}?)" in msg
    assert f"spec.sink.kafka.topic: topic {paid[:-1] + 'x'!r} does not exist" in msg
    assert f"(did you mean {paid!r}?)" in msg
    assert "'create: {partitions: N}' to spec.sink.kafka" in msg
    assert "eventbus topics create" in msg
    # the broker did not create them on the way
    assert _describe(kafka_bootstrap, shop + "p") == 0
    assert _describe(kafka_bootstrap, paid[:-1] + "x") == 0


def test_missing_dead_letter_topic_is_refused(
    eventbus_client: Any, topic_factory: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    src, out = topic_factory("in"), topic_factory("out")
    # a name nothing in a long suite's broker can be close to (difflib's cutoff is 0.6, and
    # the suite's topics are lower case with hex suffixes: "no-such-dlq-<hex>" once was)
    dlq = "NOSUCHDLQ-" + "".join(random.choices("GHJKMNPQRSTVWXYZ", k=20))
    msg = _deploy_refused(eventbus_client, tmp_path, doc(_name("dlq"), src, out, dlq))
    assert f"spec.dead_letter.kafka.topic: topic {dlq!r} does not exist on {kafka_bootstrap}" in msg
    assert "did you mean" not in msg  # nothing close to suggest


def test_create_makes_the_missing_topics_with_their_partitions(
    deploy_pipeline: Any, kafka_bootstrap: str
) -> None:
    src, out, dlq = _name("new-in"), _name("new-out"), _name("new-dlq")
    deploy_pipeline(
        doc(
            _name("create"),
            src,
            out,
            dlq,
            {"src": {"partitions": 3}, "sink": {"partitions": 2}, "dlq": {}},
        )
    )
    assert _describe(kafka_bootstrap, src) == 3
    assert _describe(kafka_bootstrap, out) == 2
    assert _describe(kafka_bootstrap, dlq) == 2  # create: {}: max(2, replicas.max)


@pytest.mark.parametrize(
    ("topic", "expect"),
    [
        ("my orders", "is not a valid Kafka topic name: ' ' is not allowed"),
        ("..", "'.' and '..' are reserved"),
        ("o" * 10_000, "(10000 characters) is too long for Kafka: at most 249 characters"),
        ("ordérs/x", "'/', 'é' are not allowed"),
    ],
)
def test_invalid_topic_names_are_refused_before_the_broker(
    eventbus_client: Any, tmp_path: Path, topic: str, expect: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc(_name("bad"), topic, "fine-out"), sort_keys=False))
    with pytest.raises(PipelineConfigError) as info:
        eventbus_client.deploy(path)
    assert expect in str(info.value)
    assert "sources[0].kafka.topic" in str(info.value)
    assert len(str(info.value)) < 2000  # a huge name is not echoed whole


def test_concurrent_deploys_creating_one_topic_both_succeed(
    eventbus_client: Any, deploy_pipeline: Any, kafka_bootstrap: str, topic_factory: Any
) -> None:
    shared = _name("shared-out")
    docs = [
        doc(_name("conc"), topic_factory("conc-in"), shared, create={"sink": {"partitions": 4}})
        for _ in range(2)
    ]
    errors: list[BaseException] = []

    def one(d: dict[str, Any]) -> None:
        try:
            deploy_pipeline(d)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(d,)) for d in docs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _describe(kafka_bootstrap, shared) == 4
    listed = {p["name"]: p["status"] for p in eventbus_client.list()}
    assert all(listed[d["metadata"]["name"]] == "RUNNING" for d in docs)


def _wait(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    msg = f"timed out waiting for {what}"
    raise AssertionError(msg)


def test_a_topic_deleted_under_a_running_pipeline_turns_it_degraded(
    eventbus_client: Any, deploy_pipeline: Any, kafka_bootstrap: str, topic_factory: Any
) -> None:
    src, out = topic_factory("del-in"), topic_factory("del-out")
    name = _name("deleted")
    deploy_pipeline(doc(name, src, out))
    assert eventbus_client.status(name)["state"] == "RUNNING"
    assert eb_cli("topics", "delete", out, "--kafka-bootstrap", kafka_bootstrap).returncode == 0

    def degraded() -> dict[str, Any] | None:
        st = eventbus_client.status(name)
        return st if st["state"] == "DEGRADED" else None

    st = _wait(degraded, 60, "the pipeline to turn DEGRADED")
    reason = st["figures"]["degraded_reason"]
    assert f"spec.sink.kafka.topic {out!r} no longer exists on {kafka_bootstrap}" in reason
    assert "eventbus logs controller" in reason
    listed = {p["name"]: p["status"] for p in eventbus_client.list()}
    assert listed[name] == "DEGRADED"
    # the controller's log, which the reason points to, says it too
    logs = eb_cli("logs", "controller", "-n", "400", "--ray-logs", str(_ray_logs_of_controller()))
    assert logs.returncode == 0, logs.stderr
    assert f"pipeline {name!r} is degraded: spec.sink.kafka.topic {out!r}" in logs.stdout
    # the topic back: RUNNING again
    created = eb_cli("topics", "create", out, "--kafka-bootstrap", kafka_bootstrap)
    assert created.returncode == 0, created.stderr
    _wait(lambda: eventbus_client.status(name)["state"] == "RUNNING", 60, "RUNNING again")


def _ray_logs_of_controller() -> Path:
    """The log folder of this session's Ray (the controller's worker file is named by its pid;
    other Ray sessions may run on the machine)."""
    import glob
    import tempfile

    import ray

    from eventbus.serving._controller import CONTROLLER_NAME, NAMESPACE

    actor = ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
    pid = int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60))
    root = Path(tempfile.gettempdir()) / "ray"
    files = glob.glob(f"{root}/session_*/logs/worker-*-{pid}.err")
    return Path(max(files, key=os.path.getmtime)).parent  # an older session may reuse the pid


def eb_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "EVENTBUS_"))}
    env.update({"EVENTBUS_HOME": "/nonexistent-eventbus-home", "COLUMNS": "300"})
    return subprocess.run(
        [sys.executable, "-m", "eventbus.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def test_publish_and_tail_name_a_missing_topic(kafka_bootstrap: str, topic_factory: Any) -> None:
    real = topic_factory("orders")
    typo = real[:-1] + "z"
    for args in (
        ("publish", typo, "--type", "t", "--data", "{}"),
        ("tail", typo, "--max", "1"),
    ):
        r = eb_cli(*args, "--kafka-bootstrap", kafka_bootstrap, timeout=60)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        err = " ".join(r.stderr.split())
        assert f"topic {typo!r} does not exist on {kafka_bootstrap}" in err
        assert f"(did you mean {real!r}?)" in err
        assert "eventbus topics create" in err
    assert _describe(kafka_bootstrap, typo) == 0
    r = eb_cli(
        "publish", "x" * 300, "--type", "t", "--data", "{}", "--kafka-bootstrap", kafka_bootstrap
    )
    assert r.returncode == 1
    assert "too long for Kafka" in r.stderr
    # and on an existing topic both work
    ok = eb_cli(
        "publish", real, "--type", "t", "--data", '{"a": 1}', "--kafka-bootstrap", kafka_bootstrap
    )
    assert ok.returncode == 0, ok.stderr
    tail = eb_cli(
        "tail",
        real,
        "--from-beginning",
        "--max",
        "1",
        "--json",
        "--kafka-bootstrap",
        kafka_bootstrap,
    )
    assert tail.returncode == 0, tail.stderr
    assert '"a": 1' in tail.stdout or '"a":1' in tail.stdout


def test_topics_cli_lists_creates_and_refuses_bad_names(kafka_bootstrap: str) -> None:
    name = _name("cli-topic")
    made = eb_cli(
        "topics", "create", name, "--partitions", "3", "--kafka-bootstrap", kafka_bootstrap
    )
    assert made.returncode == 0, made.stderr
    assert _describe(kafka_bootstrap, name) == 3
    listed = eb_cli("topics", "list", "--kafka-bootstrap", kafka_bootstrap)
    assert name in listed.stdout.split()
    assert "__consumer_offsets" not in listed.stdout
    bad = eb_cli("topics", "create", "a b", "--kafka-bootstrap", kafka_bootstrap)
    assert bad.returncode == 1
    assert "not a valid Kafka topic name" in bad.stderr
    gone = eb_cli("topics", "delete", name + "-nope", "--kafka-bootstrap", kafka_bootstrap)
    assert gone.returncode == 1
    assert f"(did you mean {name!r}?)" in " ".join(gone.stderr.split())


def test_validate_checks_topics_only_when_asked(
    kafka_bootstrap: str, topic_factory: Any, tmp_path: Path
) -> None:
    real = topic_factory("val-in")
    path = tmp_path / "p.yaml"
    document = doc(_name("val"), real[:-1] + "q", _name("val-out"), create={"sink": {}})
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    offline = eb_cli("validate", str(path))
    assert offline.returncode == 0, offline.stderr  # no cluster contacted
    checked = eb_cli("validate", str(path), "--check-topics", "--kafka-bootstrap", kafka_bootstrap)
    assert checked.returncode == 1
    err = " ".join(checked.stderr.split())
    assert f"spec.sources[0].kafka.topic: topic {real[:-1] + 'q'!r} does not exist" in err
    assert f"(did you mean {real!r}?)" in err
    assert "spec.sink" not in err  # create: it would be created at deploy
    assert _describe(kafka_bootstrap, document["spec"]["sink"]["kafka"]["topic"]) == 0
    unreachable = eb_cli(
        "validate", str(path), "--check-topics", "--kafka-bootstrap", "127.0.0.1:1"
    )
    assert unreachable.returncode == 1 and "127.0.0.1:1" in unreachable.stderr
